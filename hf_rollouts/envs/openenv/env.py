"""Any `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ environment server as an environment.

``pip install "hf_rollouts[openenv]"`` (``openenv-core``, whose ``GenericEnvClient`` speaks the protocol). An
OpenEnv env is a server (FastAPI, ``openenv.core.env_server.create_app``) with ``reset``/``step`` over HTTP
and over a WebSocket at ``/ws``. HTTP ``/reset`` and ``/step`` are stateless (a fresh env per request), so
this adapter opens **one WebSocket session per episode** (one env instance on the server per connection)
and many sessions against one server at once. A server serves more than one session only if its env class
sets ``SUPPORTS_CONCURRENT_SESSIONS = True`` and the app was made with ``max_concurrent_envs`` >= the
episodes you run at once (``--max-concurrency``); otherwise new sessions are refused with
``CAPACITY_REACHED``, and those episodes end as ``error`` with that message.

``env_config`` (:class:`OpenEnvConfig`): ``base_url`` (the server, e.g. ``http://127.0.0.1:8000``; it is sent
the model's outputs, so like an endpoint it must be allowed: ``allowed_env_models=[URL]``, CLI
``--allow-env-model URL``, which ``--env openenv:URL`` does for you), ``action_field`` (the agent's text goes
to the action as ``{action_field: text}``) and ``action_fields`` (constant fields added to every action),
``observation_field`` (the field shown to the agent; default: the observation's only text field, else the
observation as JSON), ``reset_kwargs``, ``connect_timeout`` / ``message_timeout``, ``num_train_tasks`` /
``num_eval_tasks``, and the common keys.

``task_data``: keyword arguments of ``reset`` (``{"seed": 7}``; merged over ``reset_kwargs``). Tasks from
:meth:`get_train_dataset` are seeds, even for train and odd for eval.

Mapping: the reset observation is the first user message, each step's observation the next one; the step
reward is the observation's ``reward`` (``None`` counts as 0) and ``done`` its ``done``; an observation or
metadata ``truncated: true`` on the last step stores the episode as ``truncated``. The server's metadata
(``openenv`` >= 0.4 sends it; ``openenv-core`` 0.3 servers drop it) goes to the turn's info. Any server
error, a refused session or a timeout is the episode's ``error``, never a zero reward; a timeout's message names
the server and the setting that ran out (``message_timeout``, ``connect_timeout``). The session is closed when the
episode ends, however it ends (done, cut by hf_rollouts' limits, a failing reset, step or reward, a time limit:
:meth:`OpenEnvEnv._close_episode`, and the reset's own ``except``), and the close is awaited before the episode
counts as finished, so a server with ``max_concurrent_envs`` equal to the episodes run at once never refuses one.

The client is async and so are the hooks that use it (``_initialize_episode``, ``_step_episode``): the engine
awaits them on its event loop, where thousands of waiting sessions cost no threads.

The server's own code is not part of the cache key (only ``base_url`` and the config are): clear the cache or
change the URL when the server's env changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from ...types import scalar_info
from ..adapter import AdapterEnv, AdapterEpisode
from ..config import EnvConfig, option


@dataclass(frozen=True, kw_only=True)
class OpenEnvConfig(EnvConfig):
    base_url: str = option(help="URL of a running OpenEnv server, e.g. 'http://127.0.0.1:8000' (sessions on /ws).")
    action_field: str = option("message", "Action field that receives the agent's text: {action_field: text}.")
    action_fields: dict | None = option(None, "Constant fields added to every action, e.g. {'tool': 'say'}.")
    observation_field: str | None = option(
        None, "Observation field shown to the agent (default: its only text field, else the observation as JSON)."
    )
    reset_kwargs: dict | None = option(None, "Keyword arguments of every reset; task_data's keys are merged over them.")
    connect_timeout: float = option(10.0, "Seconds to open a session.", ge=0)
    message_timeout: float = option(60.0, "Seconds to wait for one reset/step answer.", ge=0)
    num_train_tasks: int = option(1000, "Train split size when num_tasks is not given.", ge=1)
    num_eval_tasks: int = option(100, "Eval split size when num_tasks is not given.", ge=1)


def import_openenv_client() -> Any:
    return OpenEnvEnv.import_package("openenv.core.generic_client").GenericEnvClient


@dataclass
class OpenEnvEpisode(AdapterEpisode):
    """Per-episode state: the episode's WebSocket session (and the next message for the agent)."""

    client: Any
    last_observation: dict = field(default_factory=dict)


async def _close(client: Any) -> None:
    """Close a session: the client says ``close`` and waits for the server's close handshake, which the server
    sends after it has destroyed the session (openenv-core's ``/ws`` handler). Best effort: a session whose socket
    is already gone is gone on the server too."""
    try:
        await client.close()
    except Exception:  # pragma: no cover - the server also drops a session whose socket closes
        pass


class OpenEnvEnv(AdapterEnv):
    name = "openenv"
    package, distribution, extra = "openenv", "openenv-core", "openenv"
    default_max_turns = 20
    config_class = OpenEnvConfig
    model_config_keys = ("base_url",)

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        self.client_class = import_openenv_client()

    # -- protocol ---------------------------------------------------------------
    async def _call(self, coro: Any, what: str) -> Any:
        try:
            return await coro
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}".rstrip(": ")
            hint = ""
            if isinstance(exc, TimeoutError):  # the client's asyncio.wait_for on one answer
                hint = (
                    f" No answer within message_timeout={self.config.message_timeout:g} s: is the server frozen or "
                    "overloaded? Raise env_config['message_timeout'] if its steps are that slow."
                )
            elif "timed out" in text:  # websockets' opening handshake
                hint = (
                    f" No session within connect_timeout={self.config.connect_timeout:g} s: is the server up and "
                    "reachable? Raise env_config['connect_timeout'] if it is slow to accept."
                )
            # a server at capacity answers CAPACITY_REACHED and closes the socket; the close can arrive first
            if "CAPACITY_REACHED" in text or (what == "reset" and "ConnectionClosed" in text):
                hint = (
                    " The server refused (or closed) the session: at capacity? Its env class needs "
                    "SUPPORTS_CONCURRENT_SESSIONS = True and "
                    "the app max_concurrent_envs >= the episodes run at once (lower --max-concurrency otherwise)."
                )
            raise RuntimeError(f"OpenEnv server {self.config.base_url}: {what} failed: {text}.{hint}") from exc

    def observation_text(self, observation: Any) -> str:
        """The text the agent is shown for one observation dict (see ``observation_field``)."""
        if not isinstance(observation, dict):
            return str(observation)
        name = self.config.observation_field
        if name is not None:
            if name not in observation:
                raise KeyError(f"observation has no field {name!r} (observation_field); it has {sorted(observation)}")
            value = observation[name]
            return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        texts = [v for k, v in observation.items() if isinstance(v, str) and k != "metadata"]
        if len(texts) == 1:
            return texts[0]
        return json.dumps(observation, sort_keys=True, default=str)

    # -- hooks ------------------------------------------------------------------
    async def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> OpenEnvEpisode:
        c = self.config
        client = self.client_class(base_url=c.base_url, connect_timeout_s=c.connect_timeout,
                                   message_timeout_s=c.message_timeout)  # fmt: skip
        try:
            result = await self._call(client.reset(**{**(c.reset_kwargs or {}), **dict(task_data or {})}), "reset")
            if result.done:
                raise RuntimeError(f"OpenEnv server {c.base_url}: reset returned done=True; there is nothing to play.")
            episode = OpenEnvEpisode(client=client)
            episode.last_observation = dict(result.observation or {})
            episode.message = self.observation_text(result.observation)
        except BaseException:  # no episode state: _close_episode will not be called, so close the session here
            await _close(client)
            raise
        return episode

    async def _step_episode(
        self, session_id: str, state: OpenEnvEpisode, action: str
    ) -> tuple[OpenEnvEpisode, float, bool, dict[str, Any]]:
        self.check_live(state)
        payload = {**(self.config.action_fields or {}), self.config.action_field: action}
        result = await self._call(state.client.step(payload), "step")
        reward = self.reward(0.0 if result.reward is None else result.reward, f"OpenEnv server {self.config.base_url}")
        observation = dict(result.observation or {})
        metadata = getattr(result, "metadata", None) or observation.get("metadata") or {}
        info = scalar_info(dict(metadata))
        info.pop("truncated", None)
        state.last_observation = observation
        done = bool(result.done)
        if done:
            state.done = True
            truncated = metadata.get("truncated", observation.get("truncated", False))
            info["truncated"] = truncated is True
            return state, reward, True, info
        state.message = self.observation_text(observation)
        return state, reward, False, info

    async def _close_episode(self, session_id: str, state: OpenEnvEpisode) -> None:
        """Close the episode's session, however the episode ended (the engine calls this once per episode and
        awaits it before the episode's slot is given to the next one)."""
        state.done = True
        await _close(state.client)

    # -- tasks ------------------------------------------------------------------
    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        seeds = self.split_seeds(split)
        return [{"seed": next(seeds)} for _ in range(self.split_size(split, num_tasks))]
