"""``DatasetEnv`` (``dataset``): any dataset with a verifier as an environment — a question, the agent's reply, a
verdict.

``task_data`` (one row; :func:`~hf_rollouts.envs.dataset.rows.to_task_rows` builds it from a dataset's columns):

* ``prompt``: the question, a string or chat messages as TRL's conversational prompts carry them: an optional
  ``system`` message, then ``user`` and ``assistant`` messages in turn (few-shot examples) ending with the ``user``
  message the agent answers; the earlier turns open the episode as environment tokens. Left out when
  ``env_config["prompt_template"]`` builds it from the other fields;
* the reference fields the verifiers read: ``answer`` by default (a value or a list of accepted values), tests, any
  column.

``env_config`` (:class:`DatasetConfig`): ``verifier`` (a spec or a list of specs, a rubric:
:mod:`hf_rollouts.verify`), ``extraction`` (how the answer is taken from the reply: ``boxed``, ``gsm8k``,
``last_number``, ``regex`` with ``extraction_pattern``, ``code`` with ``code_language``, ``whole``),
``system_prompt``, ``prompt_template`` and ``max_turns`` (default 1).

**System prompt rule.** ``env_config["system_prompt"]`` is the system message of every row whose prompt has none. A
row whose chat prompt has its own ``system`` message and an ``env_config["system_prompt"]`` that differs from it is
refused before any episode (naming the row): neither silently replaces the other. Keep one of them (or make them
equal).

**Tries and their reward.** Each agent turn is a try: the answer is extracted and the rubric's ``ascore`` awaited
(on the engine's loop, so a slow verifier overlaps generation). A try that passes (every component with full marks:
``Verdict.passed``; a partial reward, such as a format reward alone or a TRL reward function's 0.2, is not a pass)
ends the episode; so does the last try (``max_turns``). Before that, a wrong try gets the verifier's reason back as
the next user turn (``feedback``) and another try. **Only the final try is rewarded**: its rubric reward times
``retry_discount ** (tries - 1)`` (default 1.0: a late right answer counts in full; 0.5 halves it per extra try);
earlier tries get 0, so partial credit (a format reward) is never collected once per try.

Verifiers that are models (``judge``, ``reward_model``) name them in ``env_config``: :meth:`DatasetEnv.models_to_load`
lists them for the trust rule (``allowed_env_models``), as an env's own model keys.

``info`` of every try: ``answer`` (extracted, ``None`` when none was found), ``reward`` (the rubric's, before the
discount), ``reason`` (why it is not full marks; ``None`` when it passed), ``components`` (each verifier's name,
weight, reward, reason and details), ``try`` (1-based) and ``solved``. A verifier that raises makes the episode
``error`` with its message (a TRL reward function's names its import path, the exception and the last line of its
traceback: :class:`~hf_rollouts.verify.trl_reward.RewardFunctionError`), and the try's ``info`` is then ``answer``,
``error`` (the same text), ``try`` and ``solved`` (false): a :class:`~hf_rollouts.types.StepError`. A reply every
verifier declines to score (TRL's ``None``) too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Formatter
from typing import Any, NamedTuple

import regex

from ...types import StepError
from ...verify import (
    EXTRACTIONS,
    Rubric,
    TaskFieldError,
    Verdict,
    VerifierConfigError,
    check_extraction,
    extract_answer,
    split_spec,
    verifier_class,
)
from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import TaskDataError

DEFAULT_FEEDBACK = "That is not right ({reason}). Try again."

MAX_FORMAT_WIDTH = 10_000
"""The largest width or precision a ``prompt_template`` or ``feedback`` field may ask for (``{prompt:>999999999}``
would allocate a gigabyte per row)."""
REGEX_TIMEOUT_S = 1.0
"""Seconds one ``extraction_pattern`` search of a reply may take (a pattern such as ``(a+)+$`` from a dataset can
backtrack for hours on a crafted reply): past it the try is an error (:class:`ExtractionTimeout`), never a 0."""


class ExtractionTimeout(ValueError):
    """The ``regex`` extraction's search ran past :data:`REGEX_TIMEOUT_S` (a pattern that backtracks)."""


def check_format_template(template: str, key: str) -> None:
    """``EnvConfigError`` naming ``key`` when a ``str.format`` template (``prompt_template``, ``feedback``) asks for a
    width or precision over :data:`MAX_FORMAT_WIDTH` or nests a field in a format spec (its size unbounded)."""
    try:
        parsed = list(Formatter().parse(template))
    except ValueError as exc:
        raise EnvConfigError(key, f"{key} {template!r:.80} is not a str.format template: {exc}.") from exc
    for _, name, spec, _ in parsed:
        if not spec:
            continue
        if "{" in spec:
            raise EnvConfigError(key, f"{key} field {{{name}:{spec}}} nests a field in its format spec; write it out.")
        sizes = re.findall(r"\d+", spec)
        if any(len(d) > 6 or int(d) > MAX_FORMAT_WIDTH for d in sizes):
            raise EnvConfigError(
                key,
                f"{key} field {{{name}:{spec:.40}}} asks for a width or precision over {MAX_FORMAT_WIDTH} "
                "characters; use a smaller one (or none).",
            )


@dataclass(frozen=True, kw_only=True)
class DatasetConfig(EnvConfig):
    verifier: list | dict | str = option(
        "exact",
        "The verifier spec, e.g. 'math' or {'name': 'numeric', 'abs_tol': 0.01}, or a list of specs with 'weight's "
        "(a rubric). Names: exact, numeric, math, format, trl, code, judge, reward_model (see hf_rollouts.verify).",
    )
    extraction: str = option("whole", "How the answer is taken from the reply.", choices=EXTRACTIONS)
    extraction_pattern: str | None = option(
        None, "The 'regex' extraction's pattern (its group 'answer', else its first group, else the match)."
    )
    code_language: str | None = option(None, "The 'code' extraction: take the last block of this language only.")
    prompt_template: str | None = option(
        None, "Build the prompt from task_data fields with str.format, e.g. 'Solve: {question}' (when no 'prompt')."
    )
    feedback: str = option(
        DEFAULT_FEEDBACK, "With max_turns > 1: the user turn after a wrong try ({reason}, {answer} are filled in)."
    )
    retry_discount: float = option(
        1.0, "The final try's reward is multiplied by retry_discount ** (tries - 1).", ge=0.0, le=1.0
    )

    def check(self) -> None:
        super().check()
        try:
            check_extraction(self.extraction, self.extraction_pattern)
        except ValueError as exc:
            raise EnvConfigError("extraction_pattern" if "pattern" in str(exc) else "extraction", str(exc)) from exc
        specs = self.verifier if isinstance(self.verifier, list) else [self.verifier]
        if not specs:
            raise EnvConfigError("verifier", "env_config['verifier'] is an empty list; give at least one verifier.")
        for spec in specs:  # names and weights only: building a verifier may import code not yet trusted
            try:
                verifier_class(split_spec(spec)[0])
            except VerifierConfigError as exc:
                raise EnvConfigError("verifier", str(exc)) from exc
        if self.prompt_template is not None:
            check_format_template(self.prompt_template, "prompt_template")
        check_format_template(self.feedback, "feedback")
        try:
            self.feedback.format(reason="", answer="")
        except (KeyError, IndexError, ValueError) as exc:
            raise EnvConfigError(
                "feedback", f"feedback {self.feedback!r} may use only {{reason}} and {{answer}}."
            ) from exc


@dataclass
class DatasetEpisode:
    """Per-episode state: the task (prompt rendered), the user message (and the system message and earlier turns of a
    chat prompt), the tries so far and the last verdict."""

    task: dict[str, Any]
    system: str | None
    message: str
    history: list[dict[str, str]] = field(default_factory=list)
    tries: int = 0
    verdicts: list[Verdict] = field(default_factory=list)
    feedback: str = ""


class PromptParts(NamedTuple):
    """A prompt's parts: the ``system`` message (``None``: none), the earlier ``history`` turns (few-shot ``user`` /
    ``assistant`` messages) and the ``user`` message the agent answers."""

    system: str | None
    history: list[dict[str, str]]
    user: str


def prompt_parts(prompt: Any, where: str = "task_data['prompt']") -> PromptParts:
    """The :class:`PromptParts` of a prompt: a string is the user message; chat messages are an optional ``system``
    message, then ``user`` and ``assistant`` messages in turn, ending with a ``user`` message (few-shot examples, as
    TRL's conversational datasets carry them). ``TaskDataError`` naming the field otherwise."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise TaskDataError("prompt", f"{where} is empty; every task needs a question.")
        return PromptParts(None, [], prompt)
    if not (isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt)):
        raise TaskDataError("prompt", f"{where} must be a string or chat messages, got {type(prompt).__name__}.")
    roles = [m.get("role") for m in prompt]
    system = roles[:1] == ["system"]
    turns = roles[1:] if system else roles
    expected = ["user" if k % 2 == 0 else "assistant" for k in range(len(turns))]
    if not turns or turns != expected or turns[-1] != "user":
        raise TaskDataError(
            "prompt",
            f"{where} has roles {roles}; a prompt of chat messages is an optional system message, then user and "
            "assistant messages in turn, ending with the user message the agent answers ([system?, user, "
            "(assistant, user)*]).",
        )
    if not all(isinstance(m.get("content"), str) and m["content"].strip() for m in prompt):
        raise TaskDataError("prompt", f"{where} has a message whose content is empty or not a string.")
    history = [{"role": m["role"], "content": m["content"]} for m in prompt[int(system) : -1]]
    return PromptParts(prompt[0]["content"] if system else None, history, prompt[-1]["content"])


def check_system_prompt(parts: PromptParts, system_prompt: str | None, where: str = "task_data['prompt']") -> None:
    """The system prompt rule (see the module docstring): ``TaskDataError`` when a chat prompt's own system message
    and ``env_config['system_prompt']`` are both given and differ."""
    if system_prompt and parts.system is not None and parts.system != system_prompt:
        raise TaskDataError(
            "prompt",
            f"{where} has its own system message ({parts.system!r:.60}) and env_config['system_prompt'] "
            f"({system_prompt!r:.60}) differs from it; neither replaces the other. Keep one: drop 'system_prompt' from "
            "env_config, or the system message from the prompts (or make them equal).",
        )


def render_task(config: DatasetConfig, task_data: Mapping[str, Any]) -> dict[str, Any]:
    """``task_data`` with its prompt, as a :class:`DatasetEnv` of ``config`` renders it: ``task_data['prompt']``, else
    ``config.prompt_template`` filled from its fields (``TaskDataError`` naming the missing field)."""
    task = dict(task_data)
    if task.get("prompt") is None:
        template = config.prompt_template
        if template is None:
            raise TaskDataError(
                "prompt",
                f"DatasetEnv task_data needs 'prompt' (or env_config['prompt_template']); it has {sorted(task)}.",
            )
        try:
            task["prompt"] = template.format(**task)
        except KeyError as exc:
            raise TaskDataError(
                exc.args[0],
                f"prompt_template {template!r} reads task_data[{exc.args[0]!r}], which this task lacks.",
            ) from exc
    return task


def extract_reply_answer(config: DatasetConfig, reply: str) -> str | None:
    """The answer in ``reply`` by ``config``'s extraction (what a :class:`DatasetEnv` of ``config`` scores). The
    ``regex`` extraction searches with the ``regex`` package under :data:`REGEX_TIMEOUT_S` (the pattern comes from a
    dataset): :class:`ExtractionTimeout` past it."""
    if config.extraction != "regex":
        return extract_answer(reply, config.extraction, config.extraction_pattern, config.code_language)
    try:
        matches = list(regex.finditer(config.extraction_pattern, reply, timeout=REGEX_TIMEOUT_S))
    except TimeoutError as exc:
        raise ExtractionTimeout(
            f"extraction_pattern {config.extraction_pattern!r:.80} searched a reply of {len(reply)} characters for "
            f"over {REGEX_TIMEOUT_S:g}s (it backtracks); write a pattern without nested repeats such as (a+)+."
        ) from exc
    if not matches:
        return None
    m = matches[-1]
    value = m.group("answer") if "answer" in m.re.groupindex else m.group(1) if m.re.groups else m.group(0)
    return value.strip() if value and value.strip() else None


class DatasetEnv(MultistepEnv):
    """A dataset row, the agent's reply and a verifier's verdict (see the module docstring)."""

    name = "dataset"
    default_max_turns = 1
    config_class = DatasetConfig

    def __init__(self, tokenizer: Any, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        try:
            self.rubric = Rubric.from_specs(self.config.verifier)
        except VerifierConfigError as exc:
            raise EnvConfigError("verifier", str(exc)) from exc
        self.rubric.bind(tokenizer)
        self.max_reward = self.config.max_reward if self.config.max_reward is not None else self.rubric.max_reward

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        raise NotImplementedError(
            "DatasetEnv plays the rows of your dataset and makes no tasks of its own: build task rows with "
            "hf_rollouts.envs.dataset.to_task_rows(dataset, prompt_column=..., answer_column=...) or "
            "`hf-rollouts tasks --from-dataset PATH_OR_NAME --prompt-column ... --answer-column ...`."
        )

    @classmethod
    def models_to_load(cls, env_config: dict[str, Any]) -> dict[str, list[str]]:
        """The models the verifiers load or call (a ``judge``, a ``reward_model``), trusted only if allowed."""
        try:
            models = Rubric.models_in((env_config or {}).get("verifier", "exact"))
        except VerifierConfigError:
            return {}  # a bad spec: the config check refuses it, naming the key
        return {"verifier": models} if models else {}

    @classmethod
    def modules_to_import(cls, env_config: dict[str, Any]) -> list[str]:
        """The modules the verifiers import (a ``trl`` verifier's reward function): code, trusted only if allowed."""
        try:
            return Rubric.modules_in((env_config or {}).get("verifier", "exact"))
        except VerifierConfigError:
            return []  # a bad spec: the config check refuses it, naming the key

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "verifier": self.rubric.fingerprint()}

    def render(self, task_data: Mapping[str, Any]) -> dict[str, Any]:
        """``task_data`` with its prompt: ``task_data['prompt']``, else ``prompt_template`` filled from its fields."""
        return render_task(self.config, task_data)

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        task = self.render(task_data)
        check_system_prompt(prompt_parts(task["prompt"]), self.config.system_prompt)
        try:
            self.rubric.check_task(task)
        except TaskFieldError as exc:
            raise TaskDataError(exc.key, str(exc)) from exc

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> DatasetEpisode:
        task = self.render(task_data)
        parts = prompt_parts(task["prompt"])
        check_system_prompt(parts, self.config.system_prompt)
        return DatasetEpisode(task, parts.system, parts.user, parts.history)

    def _system_prompt(self, state: DatasetEpisode) -> str | None:
        return state.system

    def _prompt_history(self, state: DatasetEpisode) -> list[dict[str, str]] | None:
        return state.history or None

    def _format_prompt(self, state: DatasetEpisode, step: int) -> str:
        return state.message if step == 0 else state.feedback

    def extract(self, reply: str) -> str | None:
        """The answer in ``reply`` by this env's extraction."""
        return extract_reply_answer(self.config, reply)

    async def _step_episode(
        self, session_id: str, state: DatasetEpisode, action: str
    ) -> tuple[DatasetEpisode, float, bool, dict[str, Any]]:
        answer = None
        try:
            answer = self.extract(action)
            verdict = await self.rubric.ascore(action, answer, state.task)
        except Exception as exc:  # the episode is an error; its infos still say what was scored and what raised
            error = f"{type(exc).__name__}: {exc}"
            raise StepError(error, {"answer": answer, "error": error, "try": state.tries + 1, "solved": False}) from exc
        state.tries += 1
        state.verdicts.append(verdict)
        solved = verdict.passed
        last = solved or state.tries >= self.max_turns
        info = {
            "answer": answer,
            "reward": verdict.reward,
            "reason": verdict.reason,
            "components": verdict.info.get("components", []),
            "try": state.tries,
            "solved": solved,
        }
        if not last:
            state.feedback = self.config.feedback.format(reason=verdict.reason, answer=answer)
            return state, 0.0, False, info
        return state, verdict.reward * self.config.retry_discount ** (state.tries - 1), True, info


__all__ = [
    "DEFAULT_FEEDBACK",
    "DatasetConfig",
    "DatasetEnv",
    "DatasetEpisode",
    "ExtractionTimeout",
    "MAX_FORMAT_WIDTH",
    "PromptParts",
    "REGEX_TIMEOUT_S",
    "check_format_template",
    "check_system_prompt",
    "extract_reply_answer",
    "prompt_parts",
    "render_task",
]
