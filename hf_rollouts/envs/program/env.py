"""``ProgramEnv``: an agent program you already have (a plain ``openai`` loop, smolagents, the OpenAI Agents SDK) as an
environment: each episode runs the program against a local OpenAI-compatible endpoint that answers with the run's
agent, and every model call it makes is recorded token-exactly (:mod:`hf_rollouts.rollout.endpoint`).

``env_config`` (:class:`ProgramConfig`): ``program`` (required), ``"package.module:function"`` (or the dotted
``package.module.function``), called as ``program(endpoint, task)`` or ``async def program(endpoint, task)``, with
``endpoint.base_url``, ``endpoint.api_key``, ``endpoint.model`` (plain strings) and ``task`` the row's ``task_data``.
**Trust**: the program's module is code named by data, under the rule of ``env_class_path``: refused before anything
runs unless it is allowed (``allowed_env_modules=["mypkg"]``, CLI ``--allow-env-module mypkg``).

**Scoring** of what the program returns (JSON data):

* with a ``verifier`` (any spec of the dataset env: ``exact``, ``numeric``, ``math``, a rubric, ...): the verifier
  scores the program's final answer: a ``str`` result, or the ``"answer"`` of a ``{"answer": ..., "reward": ...}``
  dict, against the task's reference fields (extracted per ``extraction``, as the dataset env does). **The
  verifier wins**: a reward the program also returns is kept in the episode's ``info`` (``program_reward``), not used;
* without one: the program's own reward, a number or the ``"reward"`` of a dict; a program that returns no reward to
  an env without a verifier makes its episode ``error`` (saying so).

Other keys: ``isolation`` (``"process"``: one process per episode; ``"bwrap"``: that process in the bubblewrap
sandbox, no network, only the endpoint reachable, as root under an unprivileged uid; :mod:`.launch`), ``pass_env``
(**credentials**: a ``"process"`` program gets this process's environment less every variable whose name looks like a
credential, ``HF_TOKEN``, ``OPENAI_API_KEY``, ``*_SECRET*``, ``*PASSWORD*``, ..., so that code the model writes cannot
print them into a stored reply; ``pass_env: ["OPENAI_API_KEY"]`` lists those the program gets anyway, in ``"bwrap"``
too, whose environment is otherwise empty), ``model_name`` (the name the endpoint serves and
``endpoint.model`` holds), ``sampling_fields`` (``"record"`` or ``"refuse"`` the program's ``temperature`` and
other sampling fields; the run's sampling settings govern either way), ``max_prompt_tokens`` (a longer prompt is
answered 400 ``context_length_exceeded``), ``max_turns`` (model calls per episode, default 32) and the time limits
(``step_timeout``: the program's time between two calls; ``episode_timeout``: the whole episode, its process killed).

**From the command line**: each row of a dataset becomes one task (its ``task_data``, every column), then the usual
``generate``, the program's module allowed in both::

    hf-rollouts tasks --program mypkg.agent:run --from-dataset questions.jsonl --verifier exact \
        --allow-env-module mypkg --output tasks/
    hf-rollouts generate --tasks tasks/ --model smollm2-tools --allow-env-module mypkg --output rollouts/

(``--env-config '{"isolation": "bwrap"}'`` runs each program in the sandbox; :func:`~.rows.program_task_rows` does
the same from Python.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...rollout.endpoint import EndpointAddress, ProgramError, ProgramOutcome, Renderer, program_steps
from ...types import is_finite_number, is_number
from ...verify import EXTRACTIONS, Rubric, TaskFieldError, VerifierConfigError, check_extraction, extract_answer
from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import TaskDataError
from .launch import ISOLATIONS, ProgramLaunch, run_program


def program_module(spec: Any) -> str | None:
    """The module a ``program`` spec imports (``None`` for a spec that is not a dotted ``module:function`` name)."""
    if not isinstance(spec, str) or not spec:
        return None
    module, sep, name = spec.partition(":")
    if not sep:
        module, _, name = spec.rpartition(".")
    parts = [*module.split("."), *name.split(".")]
    return module if module and name and all(p.isidentifier() for p in parts) else None


def program_source(spec: str) -> str | None:
    """A hash of the source file of the module ``spec`` names (``None`` when it has none, e.g. a built-in)."""
    module = program_module(spec)
    try:
        found = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not os.path.isfile(found.origin):
        return None
    with open(found.origin, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class ProgramConfig(EnvConfig):
    program: str = option(
        help="The agent program: 'package.module:function', called as function(endpoint, task) (sync or async)."
    )
    verifier: list | dict | str | None = option(
        None, "A verifier spec (or a rubric) scoring the program's answer; None: the reward the program returns."
    )
    extraction: str = option("whole", "How the answer is taken from the program's answer text.", choices=EXTRACTIONS)
    extraction_pattern: str | None = option(None, "The 'regex' extraction's pattern.")
    code_language: str | None = option(None, "The 'code' extraction: take the last block of this language only.")
    isolation: str = option("process", "Where each episode's program runs.", choices=ISOLATIONS)
    pass_env: list[str] | None = option(
        None, "Environment variables the program gets although their names look like credentials (HF_TOKEN, ...)."
    )
    model_name: str = option("hf-rollouts-agent", "The model name the endpoint serves (endpoint.model).")
    sampling_fields: str = option(
        "record", "The program's temperature/top_p/...: recorded, or refused with a 400.", choices=("record", "refuse")
    )
    max_prompt_tokens: int | None = option(
        None, "Prompts longer than this are answered 400 context_length_exceeded.", ge=1
    )

    def check(self) -> None:
        super().check()
        if program_module(self.program) is None:
            raise EnvConfigError(
                "program", f"program must be 'package.module:function' (or a dotted name), got {self.program!r}."
            )
        try:
            check_extraction(self.extraction, self.extraction_pattern)
        except ValueError as exc:
            raise EnvConfigError("extraction", str(exc)) from exc
        if self.verifier is not None:
            try:
                Rubric.modules_in(self.verifier)
            except VerifierConfigError as exc:
                raise EnvConfigError("verifier", str(exc)) from exc


class ProgramEnv(MultistepEnv):
    """An agent program as an environment (see the module docstring)."""

    name = "program"
    default_max_turns = 32
    config_class = ProgramConfig

    def __init__(self, tokenizer: Any, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        c = self.config
        self.rubric: Rubric | None = None
        if c.verifier is not None:
            try:
                self.rubric = Rubric.from_specs(c.verifier)
            except VerifierConfigError as exc:
                raise EnvConfigError("verifier", str(exc)) from exc
            self.rubric.bind(tokenizer)
            if self.max_reward is None:
                self.max_reward = self.rubric.max_reward
        self.launcher = ProgramLaunch(c.program, c.isolation, pass_env=tuple(c.pass_env or ()))
        self.launcher.check()
        self.renderer = Renderer(tokenizer, c.chat_template_kwargs or {})
        self.served_model, self.sampling_fields = c.model_name, c.sampling_fields
        self.max_prompt_tokens = c.max_prompt_tokens
        self.needs_socket = c.isolation == "bwrap"

    @classmethod
    def modules_to_import(cls, env_config: dict[str, Any]) -> list[str]:
        """The program's module (code: trusted only if allowed) and any the verifiers import."""
        config = env_config or {}
        module = program_module(config.get("program"))
        try:
            verifier = Rubric.modules_in(config["verifier"]) if config.get("verifier") is not None else []
        except VerifierConfigError:
            verifier = []  # a bad spec: the config check refuses it, naming the key
        return ([module] if module else []) + verifier

    @classmethod
    def models_to_load(cls, env_config: dict[str, Any]) -> dict[str, list[str]]:
        try:
            spec = (env_config or {}).get("verifier")
            models = Rubric.models_in(spec) if spec is not None else []
        except VerifierConfigError:
            return {}
        return {"verifier": models} if models else {}

    def fingerprint(self) -> dict[str, Any]:
        """The env's, the verifier's, and the program's: its spec and a hash of its module's source file (editing the
        program makes new rollouts; the module is found, not imported, once the trust rule has allowed it)."""
        out = {
            **super().fingerprint(),
            "program": self.config.program,
            "program_source": program_source(self.config.program),
        }
        return {**out, "verifier": self.rubric.fingerprint()} if self.rubric is not None else out

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        if self.rubric is not None:
            try:
                self.rubric.check_task(task_data)
            except TaskFieldError as exc:
                raise TaskDataError(exc.key, str(exc)) from exc

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        raise NotImplementedError(
            "ProgramEnv plays your program on your tasks and makes no tasks of its own: build task rows with "
            "hf_rollouts.schema.to_task_dataset([{'env_class_path': 'hf_rollouts.envs.program.ProgramEnv', "
            "'env_config': {'program': 'mypkg.agent:run'}, 'task_data': {...}}]) or `hf-rollouts tasks --program "
            "mypkg.agent:run ...`."
        )

    # -- the episode -------------------------------------------------------------------------------------------
    def episode_loop(self, session_id: str, task_data: dict[str, Any], **options: Any) -> Any:
        """The engine plays this env's episodes with this loop (:func:`~hf_rollouts.rollout.endpoint.program_steps`)
        instead of the hook loop."""
        return program_steps(self, session_id, task_data, **options)

    def launch(self, address: EndpointAddress, task_data: dict[str, Any]) -> Any:
        """Run the program for one episode (a coroutine awaited on the engine loop): override to run it elsewhere."""
        return run_program(self.launcher, address, task_data)

    def score(self, outcome: ProgramOutcome, task_data: dict[str, Any]) -> Any:
        """``(reward, info)`` of a program that returned (see the module docstring); awaitable with a verifier."""
        result = outcome.result
        answer = result.get("answer") if isinstance(result, Mapping) else result
        own = result.get("reward") if isinstance(result, Mapping) else (result if is_number(result) else None)
        info: dict[str, Any] = {}
        if own is not None:
            if not is_finite_number(own):
                raise ProgramError(f"the program returned the reward {own!r}, which is not a finite number")
            info["program_reward"] = float(own)
        if self.rubric is None:
            if own is None:
                raise ProgramError(
                    f"the program returned {result!r:.120}, which holds no reward, and env_config has no verifier: "
                    "return a number or {'answer': ..., 'reward': ...}, or give a verifier that scores the answer"
                )
            return float(own), info
        if not isinstance(answer, str):
            raise ProgramError(
                f"the program returned {result!r:.120}; the verifier scores a str answer (return the answer text, or "
                "{'answer': text})"
            )
        return self._verdict(answer, task_data, info)

    async def _verdict(self, answer: str, task_data: dict[str, Any], info: dict[str, Any]) -> tuple[float, dict]:
        c = self.config
        extracted = extract_answer(answer, c.extraction, c.extraction_pattern, c.code_language)
        assert self.rubric is not None
        verdict = await self.rubric.ascore(answer, extracted, task_data)
        info.update(answer=extracted, reward=verdict.reward, reason=verdict.reason, solved=verdict.passed)
        return verdict.reward, info

    # the hook loop is never used (episode_loop plays the episode); these satisfy the contract
    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> Any:
        raise RuntimeError("ProgramEnv episodes are played by episode_loop")

    def _format_prompt(self, state: Any, step: int) -> str:
        raise RuntimeError("ProgramEnv episodes are played by episode_loop")

    def _step_episode(self, session_id: str, state: Any, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        raise RuntimeError("ProgramEnv episodes are played by episode_loop")
