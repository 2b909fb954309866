"""``MultistepEnv``: the environment contract (hooks and config) and its doors into the rollout engine.

Subclasses implement three hooks and know nothing of models:

* ``_initialize_episode(session_id, task_data) -> state`` — a *fresh* per-episode
  state object. Episode state lives there, never on ``self``, so many episodes of
  one env instance can be live at once (the engine plays them concurrently).
* ``_format_prompt(state, step) -> str`` — the environment's message at ``step``
  (step 0: the task; later steps: feedback on the last action).
* ``_step_episode(session_id, state, action) -> (state, reward, done, info)`` —
  apply the agent's action text. ``done`` means the game ended (won or lost). An env whose own
  rules cut the episode short (its turn limit, as an external env may have) returns ``done=True``
  with ``info["truncated"] = True``: the episode is stored as ``truncated``, not ``done``.

Any of these hooks may be ``async def``: the engine awaits it on its event loop, where
thousands of waiting episodes cost no threads (:mod:`hf_rollouts.aio`; an async hook must
not block). Sync hooks run on the engine's worker threads, never on the loop; when they block, those of different
episodes run at the same time (up to ``env_workers``), so an env that waits on the outside world (an HTTP server, a
sandbox, a judge) overlaps its waits; see :attr:`MultistepEnv.thread_safe_hooks`.

Optional hooks: ``_calculate_reward(state, step_rewards) -> float`` (default: the sum of
step rewards), ``_calculate_group_rewards(task_data, states, final_rewards)`` (rewards over all of a
task's finished rollouts, see :mod:`hf_rollouts.rollout.group`), ``_close_episode(session_id, state)`` (releases what
an episode holds, on every ending), ``_system_prompt(state)``, ``_tools()`` (the env's
tools: functions it runs, or bare JSON schemas for the chat template), ``_call_tools(session_id, state, calls)``
(runs one turn's tool calls), and
``validate_task_data(task_data)`` (checks a row before any episode runs), and
``_task_list(split, num_tasks)``, which :meth:`~MultistepEnv.get_train_dataset` /
:meth:`~MultistepEnv.get_eval_dataset` need to make task rows (an env whose tasks come from the
user's own dataset can leave it out).

The episode loop, per-task padding and failure recording live in
:mod:`hf_rollouts.rollout`; :meth:`~MultistepEnv._run_complete_episode` and
:meth:`~MultistepEnv.run_trial` are thin doors into it. ``hf_rollouts.envs.check.check_env``
checks a new environment against this contract.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import threading
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ..agents.base import Agent
from ..chat import ChatDelta
from ..chat.tool_turns import ToolTurns
from ..rollout import DEFAULT_ENV_WORKERS, apply_group_rewards, pad_task, play_groups, run_episode, task_groups
from ..rollout.tool_loop import ToolLimits
from ..schema import to_task_dataset
from ..task_json import decode_task_value
from ..tools import Tool, Toolbox, run_tool_calls
from ..types import ToolCall, ToolResult
from .config import EnvConfig, UnknownConfigKeyWarning


def _declare_tools(env_name: str, tools: list[Any] | None) -> tuple[Toolbox | None, list[dict[str, Any]] | None]:
    """``_tools()``'s answer as (a toolbox when it holds functions or Tools, the schemas for the template)."""
    if not tools:
        return None, tools if tools is None else list(tools)
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"{env_name}._tools() must return a list, got {type(tools).__name__}.")
    if all(isinstance(t, dict) for t in tools):
        return None, list(tools)
    if any(isinstance(t, dict) for t in tools):
        raise TypeError(
            f"{env_name}._tools() mixes JSON schemas (dicts) with functions: return functions or Tool objects "
            "(their schemas come from their signatures), or only schemas (then no call is run)."
        )
    box = Toolbox(tools if all(isinstance(t, Tool) for t in tools) else list(tools))
    return box, box.schemas


def unknown_keys_message(cls: type[MultistepEnv], unknown: list[str]) -> str:
    return (
        f"{cls.__name__} ignores unknown env_config key(s) {unknown} (misspelled?); "
        f"the keys it reads are {list(cls.config_class.keys())}."
    )


class MultistepEnv(ABC):
    """Base class of all environments. See the module docstring for the hooks.

    ``env_config`` is declared by :attr:`config_class`, a typed dataclass
    (:mod:`hf_rollouts.envs.config`): it validates every key strictly at construction
    (:class:`~hf_rollouts.envs.config.EnvConfigError` names the key), supplies the
    defaults, and warns (:class:`~hf_rollouts.envs.config.UnknownConfigKeyWarning`)
    about keys the env does not read. The parsed config is ``self.config``; the raw
    dict stays in ``self.env_config``. Common keys (:class:`~hf_rollouts.envs.config.EnvConfig`;
    subclasses add their own by subclassing it):

    * ``max_turns`` (int >= 1): agent turns before the episode is truncated
      (default :attr:`default_max_turns`).
    * ``max_episode_tokens`` (int >= 1 | None): truncate (status ``truncated``) before an agent
      turn once the prompt has reached this many tokens; the stored sequence can exceed it
      by at most one turn's sampled tokens.
    * ``reward_placement`` (``"last"`` | ``"spread"``): see
      :data:`hf_rollouts.rollout.REWARD_PLACEMENTS`.
    * ``template_mode`` (``"append"`` | ``"render"``): how turns become prompts (see
      :mod:`hf_rollouts.rollout.samples`).
    * ``system_prompt`` (str | None): overrides :meth:`_system_prompt`.
    * ``max_reward`` (float | None): overrides :attr:`default_max_reward` (what counts as solved).
    * ``seed`` (int): seeds task generation (:meth:`get_train_dataset`).
    * ``step_timeout`` / ``episode_timeout`` (float >= 0 | None): override the run's time limits
      (read by the engine).
    * ``chat_template_kwargs`` (dict): options for every chat-template render, e.g.
      ``{"enable_thinking": false}`` (see :class:`~hf_rollouts.chat.ChatDelta`).
    * ``tool_timeout``, ``max_tool_calls``, ``max_tool_calls_per_turn``, ``count_tool_turns``: limits of
      tool environments (:mod:`hf_rollouts.rollout.tool_loop`).

    **Tools**: when :meth:`_tools` returns functions (or :class:`~hf_rollouts.tools.Tool` objects), the env is a
    tool environment: ``self.toolbox`` holds them, their schemas go into the first prompt, and the agent's calls
    are parsed from its sampled turns, run by :meth:`_call_tools` and answered with ``tool`` messages, token-exact
    (:mod:`hf_rollouts.chat.tool_turns`). A chat template that cannot carry tool turns is refused here, naming
    the family and the reason.
    """

    name: ClassVar[str] = ""
    default_max_turns: ClassVar[int] = 10
    default_max_reward: ClassVar[float | None] = None
    """The env's highest final reward, when it has one: an episode whose final reward reaches it is *solved*, unless
    the env says otherwise with ``info["solved"]`` (``env_config["max_reward"]`` overrides it; ``self.max_reward``).
    ``None``: unknown (adapters of other ecosystems); then only ``info["solved"]`` says."""
    model_config_keys: ClassVar[tuple[str, ...]] = ()
    """``env_config`` keys whose values name a model to load or an endpoint to call. Task
    data may only use values the caller allows (``allowed_env_models``): like code, a
    model or host named by a stranger's dataset is not trusted by default."""

    @classmethod
    def modules_to_import(cls, env_config: dict[str, Any]) -> list[str]:
        """Python modules that an env built from ``env_config`` would import (e.g. a verifiers environment package
        named in it). Like ``env_class_path``, a module named by a task row is code: :func:`~.registry.validate_tasks`
        refuses each one unless the caller allows its prefix (``allowed_env_modules``). Default: none."""
        return []

    @classmethod
    def models_to_load(cls, env_config: dict[str, Any]) -> dict[str, list[str]]:
        """Models or endpoints named deeper in ``env_config`` than :attr:`model_config_keys` (a verifier's judge or
        reward model), by top-level key: trusted like those, only when the caller allows them
        (``allowed_env_models``). Default: none."""
        return {}

    config_class: ClassVar[type[EnvConfig]] = EnvConfig
    """The typed declaration of this env's ``env_config`` keys (see :mod:`hf_rollouts.envs.config`)."""

    thread_safe_hooks: ClassVar[bool] = True
    """Sync hooks of different episodes run at the same time on the engine's worker threads (``env_workers``).
    An env whose hooks share something that is not thread-safe (a client, a C library, a file) sets this to
    ``False``: the engine then runs its sync hooks one at a time (``hooks_lock``), and the time an episode
    waits for that lock counts against its ``step_timeout``. Better: guard only the shared thing with a lock
    of your own, or write the hook as ``async def``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        self.config = self.parse_config(env_config)
        self.tokenizer = tokenizer
        self.env_config: dict[str, Any] = dict(env_config or {})
        self.max_turns: int = self.config.max_turns if self.config.max_turns is not None else self.default_max_turns
        self.max_episode_tokens: int | None = self.config.max_episode_tokens
        self.reward_placement: str = self.config.reward_placement
        self.template_mode: str = self.config.template_mode
        self.max_reward: float | None = (
            self.config.max_reward if self.config.max_reward is not None else self.default_max_reward
        )
        self.seed: int = self.config.seed
        self.toolbox, schemas = _declare_tools(type(self).__name__, self._tools())
        self.chat = ChatDelta(tokenizer, template_kwargs=self.config.chat_template_kwargs or {}, tools=schemas)
        self.tool_turns: ToolTurns | None = None
        self.tool_limits = ToolLimits(
            self.config.tool_timeout,
            self.config.max_tool_calls,
            self.config.max_tool_calls_per_turn,
            self.config.count_tool_turns,
        )
        if self.toolbox is not None:
            self.tool_turns = ToolTurns(self.chat)
            self.tool_turns.check()  # refuses a template that cannot carry tool turns
        self.hooks_lock: threading.Lock | None = None if self.thread_safe_hooks else threading.Lock()

    @classmethod
    def parse_config(cls, env_config: dict[str, Any] | None, *, warn: bool = True) -> EnvConfig:
        """Validate ``env_config`` against :attr:`config_class`; warn about keys it does not declare.

        Raises ``TypeError`` for a non-dict and :class:`~hf_rollouts.envs.config.EnvConfigError`
        (a ``ValueError`` whose ``key`` names the key) for a bad value.
        """
        config, unknown = cls.config_class.from_dict(env_config)
        if unknown and warn:
            warnings.warn(unknown_keys_message(cls, unknown), UnknownConfigKeyWarning, stacklevel=3)
        return config

    OPTIONAL_HOOKS: ClassVar[tuple[str, ...]] = (
        "_calculate_group_rewards",
        "_close_episode",
        "validate_task_data",
        "_run_complete_episode",
        "_prompt_history",
    )
    """Hooks whose base-class default the engine skips when the env keeps it (see :meth:`implements`)."""

    def implements(self, hook: str) -> bool:
        """Whether this env has its own ``hook`` (one of :attr:`OPTIONAL_HOOKS`), by a subclass or on the instance,
        instead of the base class's default: the engine keeps env states for a group hook only where there is one,
        skips a default close, and plays an overridden ``_run_complete_episode`` through the override."""
        if hook not in self.OPTIONAL_HOOKS:
            raise ValueError(f"{hook!r} is not an optional hook; one of {self.OPTIONAL_HOOKS}.")
        return getattr(getattr(self, hook), "__func__", None) is not getattr(MultistepEnv, hook)

    # -- hooks ---------------------------------------------------------------
    @abstractmethod
    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> Any:
        """Return a fresh state object for one episode of ``task_data``."""

    @abstractmethod
    def _format_prompt(self, state: Any, step: int) -> str:
        """The environment's message to the agent at ``step``."""

    @abstractmethod
    def _step_episode(self, session_id: str, state: Any, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        """Apply ``action``; return ``(next_state, reward, done, info)``.

        ``info["truncated"] = True`` (with ``done=True``) stores the episode as ``truncated``: the env's own
        limit ended it, it was not won or lost (see :mod:`hf_rollouts.rollout.recorder`)."""

    def _calculate_reward(self, state: Any, step_rewards: list[float]) -> float:
        """Final reward of an episode that ended without error. Default: sum of step rewards."""
        return float(sum(step_rewards))

    def _calculate_group_rewards(
        self, task_data: dict[str, Any], states: list[Any], final_rewards: list[float]
    ) -> list[float] | None:
        """Final rewards over a whole group: all rollouts of ``task_data`` that ended without error, given their final
        states and final rewards (after :meth:`_calculate_reward`). Return one reward per state, or ``None`` to keep
        them (the default). Called once per task after its episodes end and before padding; a changed reward is
        placed on the rollout's last agent turn (:mod:`hf_rollouts.rollout.group`). May be ``async def``.
        Only an env that overrides it has its states kept until then (else each is released when its episode
        ends)."""
        return None

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """Check one task row's ``task_data`` without playing it. Default: nothing (a bad row then fails in its
        episodes, as ``error``).

        ``generate_rollouts``, ``rollout_map`` and the CLI call it for every row before any episode runs; raise
        :class:`~hf_rollouts.envs.task_data.TaskDataError` (its ``key`` names the field; :func:`~hf_rollouts.envs.
        task_data.task_int` and :func:`~hf_rollouts.envs.task_data.require` check the common cases), or any other
        exception, with the reason: the run is refused with a :class:`~hf_rollouts.schema.TaskValidationError`
        naming the row and the field. Check what can be known without an episode (keys present, types, ranges,
        values the env knows), never by playing."""
        return None

    def _close_episode(self, session_id: str, state: Any) -> None:
        """Release what an episode's state holds (a server session, a subprocess, a sandbox). Default: nothing.

        Called exactly once for every episode whose :meth:`_initialize_episode` returned, whatever ended it (done,
        truncated, an exception in any hook, a time limit, the agent failing), after its final reward or its error
        and before the episode counts as finished, so the resource is free before the next episode takes its slot
        (see :mod:`hf_rollouts.rollout.episode`). Never called when ``_initialize_episode`` raised: release there
        what it opened before raising. May be ``async def``; timed by ``step_timeout``. An exception makes the
        episode ``error``."""
        return None

    def _system_prompt(self, state: Any) -> str | None:
        """Optional system message opening every episode (``env_config['system_prompt']`` wins)."""
        return None

    def _prompt_history(self, state: Any) -> list[dict[str, str]] | None:
        """Optional chat messages between the system prompt and the first prompt: earlier ``user`` / ``assistant``
        turns that the episode opens with (few-shot examples, as TRL's conversational prompts carry them). They are
        environment tokens (agent mask 0), rendered with the opening by the chat template. Default: none."""
        return None

    def _tools(self) -> list[Any] | None:
        """Optional: the env's tools, rendered into the first prompt (``tools=`` of the chat template).

        Return plain functions (sync or ``async def``, typed, with Google-style docstrings; a first parameter
        ``state`` receives the episode's state) or :class:`~hf_rollouts.tools.Tool` objects (e.g. an MCP server's,
        :mod:`hf_rollouts.tools.mcp`): the env then runs the agent's calls (see the class docstring). Bare JSON
        schemas (dicts) are only rendered: the env's ``_step_episode`` reads the agent's text as usual.
        Called by ``MultistepEnv.__init__``: it may read ``self.env_config``, not attributes a subclass sets later.
        """
        return None

    def _call_tools(self, session_id: str, state: Any, calls: list[ToolCall]) -> list[ToolResult]:
        """Run one agent turn's well-formed calls (within the limits); one :class:`~hf_rollouts.types.ToolResult`
        per call, in order. Default: the env's tools, concurrently, each within ``tool_timeout``
        (:func:`hf_rollouts.tools.run_tool_calls`; failures and timeouts are results, never exceptions). Override
        to route calls elsewhere; an exception raised here makes the episode ``error``."""
        if self.toolbox is None:
            raise RuntimeError(f"{type(self).__name__} has no executable tools (its _tools() returns none).")
        return run_tool_calls(self.toolbox, calls, state, timeout=self.tool_limits.tool_timeout)

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        """``task_data`` dicts for ``split`` ("train" or "eval"), deterministic under ``self.seed``.

        Optional: only :meth:`get_train_dataset` / :meth:`get_eval_dataset` need it. Train
        and eval tasks must be disjoint.
        """
        name = type(self).__name__
        raise NotImplementedError(
            f"{name} does not generate tasks: it has no _task_list. Either build task rows yourself "
            f"(hf_rollouts.schema.to_task_dataset([{{'env_class_path': ..., 'env_config': ..., 'task_data': ...}}])), "
            f"or add `def _task_list(self, split, num_tasks) -> list[dict]` to {name}, returning task_data dicts "
            "(disjoint for 'train' and 'eval', seeded by self._rng(...))."
        )

    def fingerprint(self) -> dict[str, Any]:
        """What besides ``env_config`` shapes this env's episodes, for the pipeline's cache key.

        Default: a hash of the source files of the env's classes (so editing an env's code
        invalidates cached rollouts). Subclasses add data files or dependency versions.
        """
        digest = hashlib.sha256()
        for cls in type(self).__mro__:
            if cls is object or not issubclass(cls, MultistepEnv):
                continue
            try:
                digest.update(Path(inspect.getfile(cls)).read_bytes())  # read and closed (no ResourceWarning)
            except (OSError, TypeError):
                digest.update(cls.__qualname__.encode())
        return {"source": digest.hexdigest()[:16]}

    # -- task datasets ---------------------------------------------------------
    def get_train_dataset(self, num_tasks: int | None = None) -> Dataset:
        """Task rows ``{env_class_path, env_config, task_data}`` for training."""
        return self._dataset("train", num_tasks)

    def get_eval_dataset(self, num_tasks: int | None = None) -> Dataset:
        """Task rows for evaluation, disjoint from :meth:`get_train_dataset`'s."""
        return self._dataset("eval", num_tasks)

    def _dataset(self, split: str, num_tasks: int | None) -> Dataset:
        path = f"{type(self).__module__}.{type(self).__qualname__}"  # what registry.class_path stores
        tasks = self._task_list(split, num_tasks)
        return to_task_dataset(
            [{"env_class_path": path, "env_config": dict(self.env_config), "task_data": t} for t in tasks]
        )

    def _rng(self, *salt: Any) -> random.Random:
        """A ``random.Random`` seeded from ``env_config['seed']`` and ``salt``; never the global one."""
        return random.Random(f"{type(self).__name__}|{self.seed}|" + "|".join(map(str, salt)))

    # -- doors into the rollout engine ------------------------------------------
    def _run_complete_episode(
        self, session_id: str, agent: Agent, task_data: dict[str, Any], *, on_error: str = "record"
    ) -> dict[str, Any]:
        """Play one episode of ``task_data`` with ``agent``; return its unpadded dictionary.

        Keys: ``full_token_ids``, ``full_attention_mask``, ``agent_token_mask``,
        ``per_token_rewards``, ``final_reward``, plus ``sampled_token_mask``, ``logprobs``
        (None if the agent gave none), ``num_turns``, ``num_cut_turns``, ``status``,
        ``error``, ``messages``, ``turns`` and ``info_json`` (the last turn's ``info`` as JSON text)
        (:class:`~hf_rollouts.types.Episode`).
        With ``on_error="raise"`` exceptions propagate. The env's group rewards are applied with the episode as
        its own group (there is no other rollout of the task here).
        """
        task_data = decode_task_value(task_data, "task_data")  # a dict, or a task row's stored JSON text
        episode = run_episode(self, session_id, agent, task_data, on_error=on_error)
        return apply_group_rewards(self, task_data, [episode], on_error=on_error)[0].to_dict()  # a group of one

    def run_trial(
        self,
        task_data_list: list[dict[str, Any]],
        agent: Agent,
        num_rollouts: int,
        *,
        on_error: str = "record",
        max_concurrency: int | None = None,
        env_workers: int = DEFAULT_ENV_WORKERS,
    ) -> dict[str, list]:
        """Play ``num_rollouts`` episodes of each task; return padded trajectories.

        Episodes of all tasks run concurrently and share each agent call (see
        :mod:`hf_rollouts.rollout.engine`). Each task's rollouts are padded to that
        task's longest rollout: ids with ``tokenizer.pad_token_id``, masks, rewards and
        log-probabilities with 0. Returned lists are flat, task-major: entry
        ``t * num_rollouts + r`` is rollout ``r`` of task ``t``. Keys: the columns of
        :data:`hf_rollouts.schema.ROLLOUT_COLUMNS` (``padded_full_token_ids``,
        ``padded_full_attention_mask``, ``padded_agent_token_mask``,
        ``padded_per_token_rewards``, ``final_rewards``, ...).
        """
        if num_rollouts < 1:
            raise ValueError(f"num_rollouts must be >= 1, got {num_rollouts}.")
        groups = play_groups(
            task_groups(self, [decode_task_value(t, "task_data") for t in task_data_list], num_rollouts),
            agent,
            max_concurrency=max_concurrency,
            on_error=on_error,
            env_workers=env_workers,
        )
        out: dict[str, list] = {}
        for group in groups:
            for key, values in pad_task(group.episodes, self.tokenizer.pad_token_id).items():
                out.setdefault(key, []).extend(values)
        return out
