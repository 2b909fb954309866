"""Any `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment (classic API) as an environment.

``pip install "hf_rollouts[verifiers]"`` (verifiers 0.3.x: its classic API, ``verifiers.legacy``, which also
answers as ``import verifiers as vf``; 0.4 removed it). An environment is loaded by id with
``vf.load_environment(env_id, **env_args)``, which imports the Python module of that id (``vf-wordle`` →
``vf_wordle``, an installed Environments Hub package): that is code, so like ``env_class_path`` a module named
by a task row must be allowed (``allowed_env_modules=["vf_wordle"]``, CLI ``--allow-env-module vf_wordle``;
``--env verifiers:vf-wordle`` allows what it names).

``env_config`` (:class:`VerifiersConfig`): ``env_id``, ``env_args`` (``load_environment``'s keyword arguments),
``model_name`` (what the env's state records as the model), ``num_train_tasks`` / ``num_eval_tasks``
(``-1``: all rows), and the common keys; ``max_turns`` defaults to the env's own ``max_turns`` (so its own
limit ends the episode, stored as ``truncated``).

``task_data`` is one row of the env's dataset (``prompt``, ``answer``, ``info``, ``example_id``, ``task``), as
``env.get_dataset()`` / ``env.get_eval_dataset()`` give them (:meth:`get_train_dataset`).

How an episode is played, without verifiers' model client: ``init_state(row, client=vf.ClientConfig(), ...)``
and ``setup_state``; each turn the env's prompt messages (``get_prompt_messages``, which calls its
``env_response``) become the next user message, and the agent's text goes back as the model's response
(``add_model_response``) until ``is_completed``. Then ``cleanup`` and the rubric: ``score_rollout`` puts the
rollout's reward on its last step; an env whose rubric has group reward functions is scored with
``score_group`` over all of a task's rollouts (:meth:`_calculate_group_rewards`, the engine's group hook). The
library renders the chat template and records tokens itself; verifiers sees message text only.

Failures: verifiers records an env error in ``state["error"]`` and its reward functions turn exceptions into
0.0 (with a log line); here both make the episode ``error`` (NaN), never a zero reward: reward functions are
wrapped to report what they raised. A ``stop_condition`` of ``max_turns_reached`` or ``prompt_too_long`` (a stop
condition of the env's own) stores the episode as ``truncated`` (except ``max_turns_reached`` of a single-turn env,
its natural end); verifiers' ``timeout_seconds`` is not applied (use ``episode_timeout``), and a turn cut by
``max_new_tokens`` reaches verifiers as a whole response (the cut is in our ``num_cut_turns``). verifiers checks its
turn limit before ``env_response`` sees the last answer, so an episode ended by the limit is ``truncated`` even when
the rubric then scores that last answer as right. An episode hf_rollouts ends first (its ``max_turns``,
``max_episode_tokens``, a tool limit) is ``truncated`` too, cleaned up and scored by the rubric like any other; that
score reaches its last agent turn through the group step (:meth:`_calculate_group_rewards`). Every episode is
cleaned up (verifiers' ``cleanup``) exactly once, however it ends, as verifiers' own rollout does in ``finally``: a
failing setup, step, tool call or reward, or a time limit included (:meth:`VerifiersEnv._close_episode`).

Tool environments (``ToolEnv``, ``StatefulToolEnv``, and others that declare ``tool_defs``): the env's tool
definitions are rendered into the first prompt (``tools=`` of the chat template), the agent's calls are parsed from
its sampled tokens in its chat template's format (:mod:`hf_rollouts.chat.tool_calls`, the library's tool loop), and
:meth:`_call_tools` hands them to verifiers as the assistant message's ``tool_calls``; verifiers' own
``env_response`` runs them (its ``call_tool``, ``update_tool_args``, ``error_formatter``) and its ``tool`` messages
are appended as tool turns, token-exact. A turn without calls is the model's answer, as in verifiers (its
``no_tools_called`` stop). verifiers formats a tool's exception as the tool message's text, so such a call is
stored with status ``ok``. Non-text content fails the episode with that reason.

The 0.4 rewrite (``verifiers.v1``) drives the agent itself (``Env.run(task, agents)`` with harness scripts); see the
docs/guides/ecosystems.md for what blocks a bridge.

The classic API is async and so are the hooks that drive it (``_initialize_episode``, ``_step_episode``,
``_calculate_group_rewards``): the engine awaits them on its event loop.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from ...tools import Tool
from ...types import ToolCall, ToolResult
from ..adapter import AdapterEnv, AdapterEpisode, package_version
from ..config import EnvConfig, option
from ..task_data import TaskDataError, require

_REWARD_ERRORS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("hfr_vf_reward_errors", default=None)
TRUNCATING_STOPS = frozenset({"max_turns_reached", "timeout_reached", "prompt_too_long"})


@dataclass(frozen=True, kw_only=True)
class VerifiersConfig(EnvConfig):
    env_id: str = option(help="A verifiers environment id for vf.load_environment, e.g. 'vf-wordle'.")
    env_args: dict | None = option(None, "Keyword arguments of load_environment.")
    model_name: str = option("hf_rollouts", "Model name recorded in the env's state (no request is ever sent).")
    num_train_tasks: int = option(-1, "Rows of env.get_dataset() when num_tasks is not given (-1: all).", ge=-1)
    num_eval_tasks: int = option(-1, "Rows of env.get_eval_dataset() when num_tasks is not given (-1: all).", ge=-1)


def import_verifiers() -> Any:
    return VerifiersEnv.import_package("verifiers.legacy")


def module_of(env_id: str) -> str:
    """The module ``vf.load_environment(env_id)`` imports (verifiers' ``env_module_name``)."""
    return env_id.replace("-", "_").split("/")[-1]


def _strict(func: Any) -> Any:
    """``func`` reporting what it raised to the scoring episode before verifiers turns it into 0.0."""
    if getattr(func, "_hfr_strict", False):
        return func

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            value = func(*args, **kwargs)
            return await value if inspect.isawaitable(value) else value
        except Exception as exc:
            errors = _REWARD_ERRORS.get()
            if errors is not None:
                errors.append(f"reward function {getattr(func, '__name__', func)!r} raised {type(exc).__name__}: {exc}")
            raise

    wrapper._hfr_strict = True  # type: ignore[attr-defined]
    return wrapper


def _rubrics(rubric: Any) -> list[Any]:
    return [rubric, *(r for sub in getattr(rubric, "rubrics", []) for r in _rubrics(sub))]


async def _scored(coro: Any) -> None:
    """Await a rubric call; raise if a reward function raised (verifiers would have scored it 0.0)."""
    errors: list[str] = []
    token = _REWARD_ERRORS.set(errors)
    try:
        await coro
    finally:
        _REWARD_ERRORS.reset(token)
    if errors:
        raise RuntimeError("verifiers rubric: " + "; ".join(dict.fromkeys(errors)))


def _text(message: Any, what: str) -> tuple[str, str]:
    """``(role, content)`` of a verifiers message (a pydantic model or a dict); only text content is played."""
    get = message.get if isinstance(message, dict) else lambda k, d=None: getattr(message, k, d)
    role, content = get("role"), get("content")
    if role == "tool" or get("tool_calls"):
        raise ValueError(f"{what} holds a tool call or tool result where hf_rollouts expects text messages.")
    return str(role), _content_text(content, what)


def _content_text(content: Any, what: str) -> str:
    if isinstance(content, list):  # content parts: text only
        parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content]
        if not all(isinstance(p, str) for p in parts):
            raise NotImplementedError(f"{what} holds non-text content parts; only text is played.")
        content = "".join(parts)
    if not isinstance(content, str):
        raise TypeError(f"{what} has content {content!r:.80}, not text.")
    return content


def _schema(tool_def: Any) -> dict[str, Any]:
    """A verifiers ``Tool`` (or its dict) as the chat template's ``{"type": "function", "function": ...}``."""
    get = tool_def.get if isinstance(tool_def, dict) else lambda k, d=None: getattr(tool_def, k, d)
    parameters = get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": get("name"), "description": get("description") or "",
                                             "parameters": parameters}}  # fmt: skip


def _run_by_verifiers(**kwargs: Any) -> Any:
    raise RuntimeError("verifiers runs this tool (VerifiersEnv._call_tools); it is never called directly.")


@dataclass
class VerifiersEpisode(AdapterEpisode):
    """Per-episode state: verifiers' own rollout state and the prompt messages of the current turn."""

    state: Any
    prompt: list = field(default_factory=list)
    ended_at_tools: bool = False  # verifiers completed the episode on a tool-calling turn
    cut: bool = False  # hf_rollouts ended it before verifiers did: scored in the group step
    cleaned: bool = False  # verifiers' cleanup ran for it


class VerifiersEnv(AdapterEnv):
    name = "verifiers"
    package, distribution, extra = "verifiers", "verifiers", "verifiers"
    default_max_turns = 10
    config_class = VerifiersConfig

    @classmethod
    def modules_to_import(cls, env_config: dict[str, Any]) -> list[str]:
        env_id = env_config.get("env_id")
        return [module_of(env_id)] if isinstance(env_id, str) and env_id else []

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)  # loads the env (_tools needs it)
        c = self.config
        own = getattr(self.vf_env, "max_turns", None)
        if c.max_turns is None and isinstance(own, int) and own > 0:
            self.max_turns = own
        self.group_scored = bool(self.vf_env.requires_group_rollouts)

    def _load(self) -> Any:
        """The verifiers env (loaded once, on first use: the base class asks for :meth:`_tools` while it builds)."""
        if getattr(self, "vf_env", None) is None:
            self.vf = import_verifiers()
            c = self.config
            self.vf_env = self.vf.load_environment(c.env_id, **(c.env_args or {}))
            for rubric in _rubrics(self.vf_env.rubric):
                rubric.funcs = [_strict(f) for f in rubric.funcs]
        return self.vf_env

    def _tools(self) -> list[Any] | None:
        """The env's ``tool_defs`` as tools; verifiers runs the calls (:meth:`_call_tools`), never these ``fn``."""
        defs = getattr(self._load(), "tool_defs", None) or []
        return [Tool(_schema(d), _run_by_verifiers) for d in defs] or None

    # -- hooks ------------------------------------------------------------------
    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """A row of the env's dataset: ``prompt`` (messages, or text) present, as ``init_state`` reads it."""
        prompt = require(task_data, "prompt", "VerifiersEnv", " (a row of the env's dataset: get_train_dataset())")
        if not isinstance(prompt, (list, str)) or not prompt:
            raise TaskDataError("prompt", f"VerifiersEnv task_data['prompt'] must be a non-empty list of messages "
                                f"(or text), got {prompt!r:.120}.")  # fmt: skip

    async def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> VerifiersEpisode:
        env, vf, row = self.vf_env, self.vf, dict(task_data)
        row.setdefault("example_id", 0)
        state = await env.init_state(row, client=vf.ClientConfig(), model=self.config.model_name)
        episode = VerifiersEpisode(state=state)
        try:
            return await self._open(episode)
        except BaseException:  # no episode state: _close_episode will not be called, so clean up here
            await self._cleanup(episode)
            raise

    async def _open(self, episode: VerifiersEpisode) -> VerifiersEpisode:
        """Set up the state verifiers' ``init_state`` made and read the first prompt."""
        env, vf = self.vf_env, self.vf
        try:
            episode.state = await env.setup_state(episode.state) or episode.state
        except vf.Error as exc:
            episode.state["error"] = exc
        state = episode.state
        self._raise_error(state)
        if await env.is_completed(state):
            raise RuntimeError(f"verifiers env {self.config.env_id!r} completed before the first turn.")
        episode.prompt = list(await env.get_prompt_messages(state))
        opening = [_text(m, "the env's prompt") for m in episode.prompt]
        roles = [r for r, _ in opening]
        if roles not in (["user"], ["system", "user"]):
            raise ValueError(
                f"VerifiersEnv plays prompts of [system?, user]; the env's prompt has roles {roles} (few-shot "
                "examples are not played)."
            )
        episode.system = opening[0][1] if len(opening) == 2 else None
        episode.message = opening[-1][1]
        return episode

    async def _prompt_now(self, episode: VerifiersEpisode) -> list:
        """The env's prompt messages after the model's last response (its ``env_response`` runs here); an error
        verifiers reports is recorded on the state, as its own rollout does, and raised."""
        try:
            prompt = list(await self.vf_env.get_prompt_messages(episode.state))
        except self.vf.Error as exc:
            episode.state["error"] = exc
            prompt = episode.prompt
        self._raise_error(episode.state)
        return prompt

    def _raise_error(self, state: Any) -> None:
        error = state.get("error")
        if error is not None:
            raise RuntimeError(f"verifiers env {self.config.env_id!r}: {type(error).__name__}: {error}")

    async def _step_episode(
        self, session_id: str, episode: VerifiersEpisode, action: str
    ) -> tuple[VerifiersEpisode, float, bool, dict[str, Any]]:
        self.check_live(episode)
        env, state = self.vf_env, episode.state
        from verifiers.legacy.types import Response, ResponseMessage

        if not episode.ended_at_tools:  # else the answer comes after verifiers' end: not its rollout's
            message = ResponseMessage(content=action, finish_reason="stop", is_truncated=False)
            response = Response(
                id=uuid.uuid4().hex, created=int(time.time()), model=self.config.model_name, message=message
            )
            await env.add_model_response(state, episode.prompt, response)
        if not await env.is_completed(state):
            prompt = await self._prompt_now(episode)
            if state.get("final_env_response") is None and not await env.is_completed(state):
                new = prompt[len(episode.prompt) + 1 :]  # after the assistant message just added
                texts = [_text(m, "the env's response") for m in new]
                if not texts or any(role != "user" for role, _ in texts):
                    raise ValueError(f"the env's response has roles {[r for r, _ in texts]}; expected user messages.")
                episode.prompt, episode.message = prompt, "\n".join(t for _, t in texts)
                return episode, 0.0, False, {}
        episode.done = True
        self._raise_error(state)
        await self._cleanup(episode)
        reward = 0.0 if self.group_scored else await self._score_rollout(state)
        stop = state.get("stop_condition")
        single_turn = stop == "max_turns_reached" and getattr(env, "max_turns", 0) == 1  # its natural end
        truncated = bool(state.get("is_truncated")) or (stop in TRUNCATING_STOPS and not single_turn)
        info = {"stop_condition": stop, "truncated": truncated}
        info.update({f"metric_{k}": float(v) for k, v in (state.get("metrics") or {}).items()
                     if isinstance(v, (int, float))})  # fmt: skip
        return episode, reward, True, info

    async def _call_tools(self, session_id: str, episode: VerifiersEpisode, calls: list[ToolCall]) -> list[ToolResult]:
        """One tool-calling turn, run by verifiers: the calls go in as the model's ``tool_calls``, its
        ``env_response`` answers them with ``tool`` messages (matched back by call id)."""
        env, state = self.vf_env, episode.state
        from verifiers.legacy.types import Response, ResponseMessage
        from verifiers.legacy.types import ToolCall as VfToolCall

        vf_calls = [VfToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments)) for c in calls]
        message = ResponseMessage(content=None, tool_calls=vf_calls, finish_reason="tool_calls", is_truncated=False)
        response = Response(
            id=uuid.uuid4().hex, created=int(time.time()), model=self.config.model_name, message=message
        )
        await env.add_model_response(state, episode.prompt, response)
        if await env.is_completed(state):  # e.g. its own turn limit: nothing will read the results
            episode.ended_at_tools = True
            return [ToolResult(c, "Error: not run, the environment ended the episode.", "not_run") for c in calls]
        prompt = await self._prompt_now(episode)
        new = prompt[len(episode.prompt) + 1 :]  # after the assistant message just added
        answers: dict[str, str] = {}
        for m in new:
            get = m.get if isinstance(m, dict) else lambda k, d=None, m=m: getattr(m, k, d)
            if get("role") != "tool":
                raise ValueError(f"the env answered tool calls with a {get('role')!r} message; expected tool messages.")
            answers[str(get("tool_call_id"))] = _content_text(get("content"), "the env's tool message")
        missing = [c.id for c in calls if c.id not in answers]
        if missing:
            raise ValueError(f"the env's tool messages answer no call with id {missing}.")
        episode.prompt = prompt
        return [ToolResult(c, answers[c.id]) for c in calls]

    async def _calculate_reward(self, episode: VerifiersEpisode, step_rewards: list[float]) -> float:
        """The sum of the step rewards; an episode hf_rollouts ended before verifiers did is cleaned up here (it is
        scored in :meth:`_calculate_group_rewards`, which places the score on its last agent turn)."""
        if not episode.done:
            episode.done = episode.cut = True
            await self._cleanup(episode)
        return float(sum(step_rewards))

    async def _cleanup(self, episode: VerifiersEpisode) -> None:
        """verifiers' ``cleanup`` of the episode's state, once."""
        if not episode.cleaned:
            episode.cleaned = True
            await self.vf_env.cleanup(episode.state)

    async def _close_episode(self, session_id: str, episode: VerifiersEpisode) -> None:
        """verifiers' ``cleanup`` for an episode that ended before it ran (a failing step, tool call or reward, a time
        limit); a no-op for one that was cleaned up on its last step."""
        await self._cleanup(episode)

    async def _calculate_group_rewards(
        self, task_data: dict[str, Any], episodes: list[Any], final_rewards: list[float]
    ) -> list[float] | None:
        """Group rubrics over all of a task's rollouts; otherwise the rubric's score of each rollout hf_rollouts
        ended first (the others were scored on their last step)."""
        env = self.vf_env
        if self.group_scored and episodes:
            states, rubric = [e.state for e in episodes], env.rubric
            await _scored(rubric.score_group(states) if env.score_rollouts else rubric.dummy_score_group(states))
            for state in states:
                await env.rubric.cleanup(state)
            return [float(s["reward"]) for s in states]
        if not any(e.cut for e in episodes):
            return None
        rewards = list(final_rewards)
        for i, e in enumerate(episodes):
            if e.cut:
                rewards[i] = await self._score_rollout(e.state)
        return rewards

    async def _score_rollout(self, state: Any) -> float:
        env = self.vf_env
        await _scored(env.rubric.score_rollout(state) if env.score_rollouts else env.rubric.dummy_score_rollout(state))
        await env.rubric.cleanup(state)
        return self.reward(state["reward"], "the verifiers rubric", finite=True)

    # -- tasks ------------------------------------------------------------------
    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        n = self.split_size(split, num_tasks)
        data = self.vf_env.get_eval_dataset(n=n) if split == "eval" else self.vf_env.get_dataset(n=n)
        return [_jsonable_row(row) for row in data]

    def fingerprint(self) -> dict[str, Any]:
        """The adapter's (source, verifiers' version) and the loaded environment package's module and version."""
        module = module_of(self.config.env_id)
        return {**super().fingerprint(), "env_module": module,
                "env_module_version": package_version(module) or package_version(module.replace("_", "-"))}  # fmt: skip


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(row), default=str))
