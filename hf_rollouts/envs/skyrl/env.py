"""Any `SkyRL-gym <https://github.com/NovaSky-AI/SkyRL/tree/main/skyrl-gym>`_ text environment as an environment.

``pip install "hf_rollouts[skyrl]"``. SkyRL-gym envs (``BaseTextEnv``) are built per episode with
``skyrl_gym.make(env_class, env_config=..., extras=...)``, opened with ``init(prompt)`` and stepped with
``step(action_text) -> {observations, reward, done, metadata}``; they see text only. This adapter
renders the chat template and records the tokens itself (SkyRL's own generator re-tokenizes
observations; here the stored ids are what the model sampled), and takes rewards and ``done`` from
the env.

``env_config`` (:class:`SkyRLGymConfig`): ``env_class`` (an id of ``skyrl_gym``'s registry:
``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``lcb``, ``text2sql``, ``search``, ...; a
``"module:Env"`` id, which makes SkyRL import that module, is refused: register your own env with
``skyrl_gym.register`` in your code instead), ``skyrl_env_config`` (the env's own config, given to it
as an OmegaConf ``DictConfig``, e.g. ``{"db_path": "/data/sql"}`` for ``text2sql``), ``train_data`` /
``eval_data`` (a SkyRL dataset: parquet file(s), a ``save_to_disk`` directory or a Hub id),
``turn_limit_truncates``, ``empty_observation``, and the common keys. ``max_turns`` (default 5) is
also passed to the env as ``extras["max_turns"]``, as SkyRL's generator does.

``task_data`` is one SkyRL dataset row: ``{"prompt": [messages], "extras": {...}}``, where ``extras``
holds the row's other fields (``reward_spec``, ``extra_info``, ``db_id``, ``data``, ...) exactly as
SkyRL passes them (:func:`skyrl_task`). The prompt must be ``[system?, user]``.

Mapping: the observations' contents (joined by newlines) are the next user message; an empty
observation list on a step that is not ``done`` sends ``empty_observation``. SkyRL envs do not say
why they ended: one that ends on its own last turn (``env.turns >= env.max_turns``) is stored as
``truncated`` (``info["truncated"]``), even when that last answer scored — set
``turn_limit_truncates: false`` to store every ending as ``done``. ``postprocessed_action`` is not
applied (the stored tokens stay as sampled) but recorded in the turn's info. Sampling stops on
strings as SkyRL configs do with ``--stop '</answer>'`` (:class:`~hf_rollouts.agents.sampling.SamplingConfig`).
An exception from the env is the episode's ``error``, never a zero reward. Each episode's SkyRL env is closed
(``env.close()``) when the episode ends, however it ends (:meth:`SkyRLGymEnv._close_episode`; an ``init`` that
raises closes it at once).

Offline here (SkyRL-gym 0.4.0): ``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``lcb`` (runs the model's code
in a subprocess of this machine, with SkyRL's time limits and no other sandbox) and ``text2sql`` (a
local sqlite database under ``db_path``). ``search``/``searchcode`` need a retrieval server.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ...types import scalar_info
from ..adapter import AdapterEnv, AdapterEpisode
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import TaskDataError, require

DEFAULT_EMPTY_OBSERVATION = "(The environment returned no message. Continue.)"


@dataclass(frozen=True, kw_only=True)
class SkyRLGymConfig(EnvConfig):
    env_class: str = option(help="A skyrl_gym registry id, e.g. 'gsm8k', 'gsm8k_multi_turn', 'text2sql'.")
    skyrl_env_config: dict | None = option(None, "The env's own config (an OmegaConf DictConfig for SkyRL envs).")
    train_data: str | None = option(
        None, "SkyRL dataset for get_train_dataset: parquet file(s), a save_to_disk directory or a Hub id."
    )
    eval_data: str | None = option(None, "SkyRL dataset for get_eval_dataset (same forms).")
    turn_limit_truncates: bool = option(True, "An episode the env ends on its own last turn is stored as truncated.")
    empty_observation: str = option(DEFAULT_EMPTY_OBSERVATION, "Message sent when a step returns no observation.")

    def check(self) -> None:
        if ":" in self.env_class:
            raise EnvConfigError(
                "env_class",
                f"env_config['env_class'] {self.env_class!r} names a module to import ('module:Env'); only ids already "
                "in skyrl_gym's registry are played. Register your env with skyrl_gym.register in your own code.",
            )


def import_skyrl_gym() -> Any:
    return SkyRLGymEnv.import_package()


def skyrl_task(row: dict[str, Any]) -> dict[str, Any]:
    """``task_data`` of one SkyRL dataset row: its ``prompt`` and, as ``extras``, every other field but
    ``env_class`` (what SkyRL's generator passes to ``skyrl_gym.make``)."""
    if "prompt" not in row:
        raise ValueError(f"a SkyRL dataset row needs a 'prompt' (a list of messages); got keys {sorted(row)}.")
    return {"prompt": row["prompt"], "extras": {k: v for k, v in row.items() if k not in ("prompt", "env_class")}}


@dataclass
class SkyRLEpisode(AdapterEpisode):
    """Per-episode state: the SkyRL env object (and the next message for the agent)."""

    env: Any


SAFE_ENV_CLASSES = frozenset({"gsm8k", "gsm8k_multi_turn", "aime"})
"""SkyRL envs that only compare text. The others run the model's output (``lcb``, ``searchcode``: Python in a
subprocess; ``text2sql``: SQL on a local database file that the task row names) or send it to a service
(``search``); an env you registered with ``skyrl_gym.register`` runs your code: a task row may name them only when
the caller allows their module (:func:`entry_module`), as for any code."""


def entry_module(env_class: str) -> str:
    """The module holding the code of skyrl_gym registry id ``env_class``: its entry point's module (a
    ``"module:Class"`` string's module, or a registered class's or function's ``__module__``). An id not registered
    (or no skyrl_gym installed) gives ``skyrl_gym.envs.<id>``; building that env then fails, saying so."""
    try:
        spec = import_skyrl_gym().registry.get(env_class)
    except ImportError:
        spec = None
    entry = getattr(spec, "entry_point", None)
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    return module or f"skyrl_gym.envs.{env_class}"


class SkyRLGymEnv(AdapterEnv):
    name = "skyrl"
    package, distribution, extra = "skyrl_gym", "skyrl-gym", "skyrl"
    default_max_turns = 5
    config_class = SkyRLGymConfig

    @classmethod
    def modules_to_import(cls, env_config: dict[str, Any]) -> list[str]:
        """The module whose code plays ``env_class``, for every env but :data:`SAFE_ENV_CLASSES`: the module of its
        registry entry point (:func:`entry_module`), e.g. ``skyrl_gym.envs.lcb.env``, ``skyrl_gym.envs.sql.env``
        (``text2sql``), or the module of an env you registered with ``skyrl_gym.register``. Allowed by prefix:
        ``allowed_env_modules=["skyrl_gym.envs.lcb"]``, ``["my_envs"]`` (CLI ``--allow-env-module``; ``--env
        skyrl:lcb`` allows what it names)."""
        name = env_config.get("env_class")
        return [entry_module(name)] if isinstance(name, str) and name not in SAFE_ENV_CLASSES else []

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        self.gym = import_skyrl_gym()
        registry = self.gym.registry
        if self.config.env_class not in registry:
            raise ValueError(
                f"{self.config.env_class!r} is not in skyrl_gym's registry; registered: {sorted(registry)}."
            )
        from omegaconf import OmegaConf

        self._env_config = OmegaConf.create(self.config.skyrl_env_config or {})

    # -- hooks ------------------------------------------------------------------
    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """A SkyRL row: ``prompt`` a non-empty list of ``{role, content}`` text messages, ``extras`` a dict if given."""
        hint = " (one SkyRL dataset row {'prompt': [messages], 'extras': {...}}: hf_rollouts.envs.skyrl.skyrl_task)"
        prompt = require(task_data, "prompt", "SkyRLGymEnv", hint)
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt
            )
        ):
            raise TaskDataError("prompt", f"SkyRLGymEnv task_data['prompt'] must be a non-empty list of "
                                f"{{'role': str, 'content': str}} messages, got {prompt!r:.120}.")  # fmt: skip
        if not isinstance(task_data.get("extras") or {}, dict):
            raise TaskDataError(
                "extras", f"SkyRLGymEnv task_data['extras'] must be a dict, got {task_data['extras']!r:.80}."
            )

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> SkyRLEpisode:
        self.validate_task_data(task_data)
        extras = copy.deepcopy(task_data.get("extras") or {})
        extras["max_turns"] = self.max_turns  # as SkyRL's generator does
        env = self.gym.make(self.config.env_class, env_config=self._env_config, extras=extras)
        try:
            prompt, _ = env.init(copy.deepcopy(list(task_data["prompt"])))
            system, message = self._opening(prompt)
        except BaseException:  # no episode state: _close_episode will not be called, so close it here
            env.close()
            raise
        return SkyRLEpisode(env=env, system=system, message=message)

    def _opening(self, prompt: Any) -> tuple[str | None, str]:
        messages = list(prompt or [])
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
        if roles not in (["user"], ["system", "user"]) or not all(isinstance(m.get("content"), str) for m in messages):
            raise ValueError(
                f"SkyRLGymEnv plays prompts of [system?, user] messages with text content; init() returned roles "
                f"{roles}. Merge the prompt's messages into one user message (and an optional system message)."
            )
        return (messages[0]["content"] if len(messages) == 2 else None), messages[-1]["content"]

    def _step_episode(
        self, session_id: str, state: SkyRLEpisode, action: str
    ) -> tuple[SkyRLEpisode, float, bool, dict[str, Any]]:
        self.check_live(state, f"the episode of SkyRL env {self.config.env_class!r}")
        out = state.env.step(action)
        if not isinstance(out, dict) or not {"observations", "reward", "done"} <= set(out):
            raise TypeError(
                f"SkyRL env {self.config.env_class!r}.step returned {out!r:.120}; expected "
                "{'observations', 'reward', 'done', 'metadata'}."
            )
        reward, done = self.reward(out["reward"], f"SkyRL env {self.config.env_class!r}"), out["done"]
        info = scalar_info(out.get("metadata"))
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = str(out["postprocessed_action"])  # recorded, never applied to tokens
        if done:
            state.done = True
            turns, limit = getattr(state.env, "turns", None), getattr(state.env, "max_turns", None)
            if self.config.turn_limit_truncates and isinstance(turns, int) and isinstance(limit, int) and turns > 0:
                info["truncated"] = turns >= limit
            return state, reward, True, info
        contents = [str(m.get("content", "")) for m in out["observations"] or [] if isinstance(m, dict)]
        state.message = "\n".join(c for c in contents if c) or self.config.empty_observation
        return state, reward, False, info

    def _close_episode(self, session_id: str, state: SkyRLEpisode) -> None:
        """Close the episode's SkyRL env, however the episode ended (a failing step included)."""
        state.done = True
        state.env.close()

    # -- tasks --------------------------------------------------------------------
    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):  # no default sizes: the SkyRL dataset's rows
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
        source = self.config.eval_data if split == "eval" else self.config.train_data
        if source is None:
            raise NotImplementedError(
                f"SkyRLGymEnv makes {split} tasks from a SkyRL dataset: set env_config['{split}_data'] to parquet "
                "file(s), a save_to_disk directory or a Hub id (rows {prompt, env_class, reward_spec, ...}), or build "
                "task rows with hf_rollouts.envs.skyrl.skyrl_task(row)."
            )
        from ...sources import load_dataset_source

        data = load_dataset_source(source, split=split)
        if "env_class" in data.column_names:
            data = data.filter(lambda c: c == self.config.env_class, input_columns="env_class")
        rows = data.select(range(min(num_tasks, len(data)))) if num_tasks is not None else data
        return [skyrl_task(row) for row in rows]
