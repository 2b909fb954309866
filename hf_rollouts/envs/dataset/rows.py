"""From a dataset to task rows of :class:`~hf_rollouts.envs.dataset.env.DatasetEnv`, in one call.

:func:`to_task_rows` adds the three task columns (``env_class_path``, ``env_config``, ``task_data``) to every row of a
dataset and keeps its other columns; :class:`TaskRows` is the same as a function for your own ``Dataset.map``::

    tasks = to_task_rows(gsm8k, prompt_column="question", answer_column="answer", answer_extraction="gsm8k",
                         env_config={"verifier": "numeric", "extraction": "last_number"})
    tasks = gsm8k.map(TaskRows(prompt_column="question", ...), with_indices=True, features=TaskRows.features(gsm8k))

Before anything is mapped, every row is checked: a missing column is refused naming it (and the columns there are),
an empty value (``None``, ``""``, ``[]``) naming the row and the column, and each verifier's own check of the task
(:meth:`~hf_rollouts.verify.base.Verifier.check_task`, e.g. a reference ``numeric`` cannot read) naming the row and
the field. :func:`load_source` loads what the CLI's ``--from-dataset`` names: a Hub dataset, a local folder, a
``save_to_disk`` directory, json / jsonl / csv / parquet files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Formatter
from typing import Any

from datasets import Dataset, DatasetDict, Features, load_dataset

from ...schema import TASK_COLUMNS, TASK_FEATURES, TaskValidationError, encode_task_row
from ...sources import load_dataset_source
from ...verify import Rubric, TaskFieldError, check_extraction, extract_answer
from ..config import EnvConfigError
from ..registry import check_modules_allowed, class_path
from .env import DatasetEnv, check_system_prompt, prompt_parts

CODE_ENV_CONFIG: dict[str, Any] = {"verifier": "code", "extraction": "code"}
"""The ``env_config`` of code task rows (HumanEval's, and the default of rows with a ``tests_column``; a key of your
``env_config`` wins): the ``code`` verifier over the reply's last fenced code block."""

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


def empty(value: Any) -> bool:
    """``None``, a blank string or an empty list: a value a task cannot use."""
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)


@dataclass(frozen=True)
class TaskRows:
    """A ``Dataset.map`` function: one dataset row -> the task columns of a :class:`DatasetEnv` row.

    * ``prompt_column``: the question (a string, or chat messages); or ``prompt_template``, a ``str.format`` template
      over the row's columns (``"Solve: {question}"``), rendered into ``task_data["prompt"]``;
    * ``answer_column``: copied to ``task_data["answer"]`` (what the verifiers read by default); ``None``: no answer
      (a verifier that reads other columns, code tests); ``answer_extraction`` takes the answer out of a longer value
      first (``"gsm8k"``: ``"... #### 42"`` -> ``"42"``; any of :data:`~hf_rollouts.verify.EXTRACTIONS`);
    * ``tests_column``: a code task's tests (Python source such as HumanEval's ``def check(candidate)``, or a list of
      statements such as MBPP's ``assert`` list), copied to ``task_data["test"]`` (what the ``code`` verifier reads);
      with it, ``env_config``'s ``verifier`` and ``extraction`` default to ``"code"`` (:data:`CODE_ENV_CONFIG`). Give
      ``answer_column=None`` beside it when the dataset has no answer column;
    * ``columns``: more columns copied into ``task_data`` under their names (tests, a ``solution`` a TRL reward
      function reads);
    * ``env_config``: the env's config of every row (``verifier``, ``extraction``, ``system_prompt``, ``max_turns``).

    Called with the row's index (``with_indices=True``), its errors name the row."""

    prompt_column: str | None = "prompt"
    answer_column: str | None = "answer"
    prompt_template: str | None = None
    answer_extraction: str | None = None
    tests_column: str | None = None
    columns: Sequence[str] = ()
    env_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prompt_column is None) == (self.prompt_template is None):
            raise ValueError("give exactly one of prompt_column and prompt_template.")
        if self.answer_extraction is not None:
            check_extraction(self.answer_extraction)
        if self.tests_column is not None and self.tests_column == self.answer_column:
            raise ValueError(f"column {self.tests_column!r} is given as both the answer and the tests column.")
        try:
            DatasetEnv.parse_config(dict(self.env_config))
        except EnvConfigError as exc:
            raise EnvConfigError(exc.key, f"env_config of DatasetEnv, key {exc.key!r}: {exc}") from exc
        object.__setattr__(self, "columns", tuple(self.columns))
        defaults = CODE_ENV_CONFIG if self.tests_column is not None else {}
        object.__setattr__(self, "env_config", {**defaults, **self.env_config})

    def needed_columns(self) -> list[str]:
        """The dataset columns these rows read."""
        template = [f.split(".")[0].split("[")[0] for _, f, _, _ in Formatter().parse(self.prompt_template or "") if f]
        named = [self.prompt_column, *template, self.answer_column, self.tests_column, *self.columns]
        return list(dict.fromkeys(c for c in named if c is not None))

    @staticmethod
    def features(dataset: Dataset) -> Features:
        """The map's output features: ``dataset``'s plus the task columns (:data:`~hf_rollouts.schema.TASK_FEATURES`:
        ``env_config`` and ``task_data`` as JSON text that ``json.loads`` gives back exactly, floats to the last bit
        and integers of any size)."""
        return Features({**{k: v for k, v in dataset.features.items() if k not in TASK_COLUMNS}, **TASK_FEATURES})

    def __call__(self, row: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
        """The task columns of ``row`` as stored (``env_config`` / ``task_data`` as exact JSON text)."""
        where = "row" if index is None else f"row {index}"
        return encode_task_row(self.task_row(row, index), where)

    def task_row(self, row: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
        """The task columns of ``row`` with ``env_config`` / ``task_data`` as dicts."""
        where = "row" if index is None else f"row {index}"
        for column in self.needed_columns():
            if column not in row:
                raise TaskValidationError(f"{where}: no column {column!r}; the dataset has {sorted(row)}.")
            if empty(row[column]):
                raise TaskValidationError(f"{where}, column {column!r}: the value is empty ({row[column]!r}).")
        task: dict[str, Any] = {c: row[c] for c in self.columns}
        if self.prompt_template is not None:
            try:
                task["prompt"] = self.prompt_template.format(**row)
            except (KeyError, IndexError) as exc:
                raise TaskValidationError(
                    f"{where}: prompt_template {self.prompt_template!r} reads {exc}, which is not a column "
                    f"({sorted(row)})."
                ) from exc
        else:
            task["prompt"] = row[self.prompt_column]
        try:
            where_prompt = f"column {self.prompt_column or 'prompt_template'!r}"
            check_system_prompt(
                prompt_parts(task["prompt"], where_prompt), self.env_config.get("system_prompt"), where_prompt
            )
        except ValueError as exc:
            raise TaskValidationError(f"{where}: {exc}") from exc
        if self.answer_column is not None:
            answer = row[self.answer_column]
            if self.answer_extraction is not None:
                answer = extract_answer(str(answer), self.answer_extraction)
                if answer is None:
                    raise TaskValidationError(
                        f"{where}, column {self.answer_column!r}: the {self.answer_extraction!r} extraction finds no "
                        f"answer in {row[self.answer_column]!r:.80}."
                    )
            task["answer"] = answer
        if self.tests_column is not None:
            task["test"] = row[self.tests_column]
        return {"env_class_path": class_path(DatasetEnv), "env_config": dict(self.env_config), "task_data": task}


def to_task_rows(dataset: Dataset, *, allowed_env_modules: Iterable[str] = (), **options: Any) -> Dataset:
    """``dataset`` with the task columns of :class:`DatasetEnv` added (its other columns kept); ``options`` are
    :class:`TaskRows`'s. Every row is checked first (columns, empty values, each verifier's check of the task):
    :class:`~hf_rollouts.schema.TaskValidationError` names the row and the column before any work.

    A ``trl`` verifier names a reward function by import path: code, which the check imports. As when the rows are
    played, its module must be allowed first (``allowed_env_modules=["my_rewards"]``, CLI ``--allow-env-module``):
    otherwise nothing is imported and the error says how to allow it."""
    if not isinstance(dataset, Dataset):
        hint = " Pick a split first, e.g. dataset['train']." if isinstance(dataset, DatasetDict) else ""
        raise TypeError(f"to_task_rows takes a datasets.Dataset, got {type(dataset).__name__}.{hint}")
    rows = TaskRows(**options)
    missing = [c for c in rows.needed_columns() if c not in dataset.column_names]
    if missing:
        hint = (
            " No reference answer (code tests, a verifier that reads other columns)? answer_column=None (CLI: "
            "--answer-column none; --tests-column COLUMN for a code task's tests)."
            if rows.answer_column in missing
            else ""
        )
        raise TaskValidationError(
            f"the dataset has no column(s) {missing}; it has {dataset.column_names}. Name the columns that hold the "
            "prompt and the answer (prompt_column=..., answer_column=...; CLI: --prompt-column, --answer-column)."
            + hint
        )
    verifier = rows.env_config.get("verifier", "exact")
    check_modules_allowed(Rubric.modules_in(verifier), allowed_env_modules, "env_config['verifier']")
    rubric = Rubric.from_specs(verifier)
    for i, row in enumerate(dataset.select_columns(rows.needed_columns()) if len(dataset) else []):
        task = rows.task_row(row, i)["task_data"]
        try:
            rubric.check_task(task)
        except TaskFieldError as exc:
            column = {"answer": rows.answer_column, "test": rows.tests_column}.get(exc.key) or exc.key
            raise TaskValidationError(f"row {i}, column {column!r}: {exc}") from exc
    return dataset.map(rows, with_indices=True, features=TaskRows.features(dataset), desc="task rows")


def answer_column_option(value: str | None, tests_column: str | None = None) -> str | None:
    """What the CLI's ``--answer-column`` means: unset -> ``"answer"`` (``None`` with ``--tests-column``: a code task
    has no answer); ``"none"`` or ``""`` -> ``None`` (no answer column: a verifier that reads other columns)."""
    if value is None:
        return None if tests_column is not None else "answer"
    return None if value.strip().lower() in ("", "none") else value


def load_source(source: str, split: str = "train", name: str | None = None) -> Dataset:
    """A dataset from what ``--from-dataset`` names: a json / jsonl / csv / parquet / txt file (its rows are split
    ``split``), a ``save_to_disk`` directory, a folder of data files, or a Hub dataset id (``name``: its config,
    e.g. GSM8K's ``"main"``). A path that is not there (a data file's suffix, or starting with ``.``, ``/``, ``~``)
    raises ``FileNotFoundError``, not a Hub look-up."""
    path = Path(source)
    if path.is_file() and path.suffix in FILE_BUILDERS:
        return load_dataset(FILE_BUILDERS[path.suffix], data_files={split: str(path)}, split=split)
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        return load_dataset_source(source, split)
    if path.is_file():
        raise ValueError(f"{source}: cannot tell its format; give a {sorted(FILE_BUILDERS)} file, or a folder.")
    if not path.exists() and (path.suffix in FILE_BUILDERS or source.startswith((".", "/", "~"))):
        raise FileNotFoundError(f"{source}: no such file or folder (from {Path.cwd()}); check the path.")
    loaded = load_dataset(source, name, split=split)
    return loaded[split] if isinstance(loaded, DatasetDict) else loaded


__all__ = ["CODE_ENV_CONFIG", "TaskRows", "answer_column_option", "load_source", "to_task_rows"]
