"""Group rewards: one env hook sees all of a task's rollouts once they have finished, before padding.

Some rewards are only defined over a group (verifiers' group rubrics rank or compare a task's
completions; a pairwise judge; a diversity bonus). After the ``num_rollouts`` episodes of one task have
ended, and before they are padded, the engine runs :func:`group_steps`, which calls the env's
``_calculate_group_rewards(task_data, states, final_rewards)`` with the final state object and final
reward of each rollout that did not fail (``error`` rollouts are left out and stay ``error``). It
returns the new final rewards, one per state, or ``None`` to keep them.

The reward rule holds afterwards: a rollout whose final reward changes by ``delta`` gets ``delta``
added to its *last* agent turn's step reward, placed on that turn's tokens by the env's
``reward_placement`` (the last agent token by default), so ``final_reward - sum(per_token_rewards)``
is what it was before (0 for an env whose final reward is the sum of its step rewards). The turn's
info records ``group_reward``. A hook that raises, returns an awaitable that fails, runs past ``step_timeout``, or
returns anything but one finite number per state makes every rollout it was given ``error`` (NaN), with the
message; never a zero reward. The hook may be ``async def``: it is awaited on the engine loop, where the env's async
hooks ran; a sync one runs on the engine's workers, like every sync hook.

Env states are kept on the episodes only for an env that overrides the hook, only until this step, and then
dropped: they never reach a dataset. An episode with no agent turn keeps its final reward (there is no turn to
place a change on).

Last, with the final rewards settled, each rollout's ``solved`` is settled (:func:`settle_solved`): the env's own
word (``info["solved"]``), else whether the final reward reached the env's ``max_reward``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from ..types import Episode, is_finite_number
from .episode import HookAwait, HookClock, drive, hook_call
from .recorder import place_reward

GROUP_HOOK = "_calculate_group_rewards"


@dataclass
class EpisodeGroup:
    """The finished rollouts of one task, in rollout order, group rewards applied: one GRPO group, one padded row."""

    env: Any
    task_data: dict[str, Any]
    episodes: list[Episode]


def _checked(result: Any, n: int, name: str) -> list[float] | None:
    if result is None:
        return None
    if isinstance(result, (str, bytes)) or not hasattr(result, "__len__") or len(result) != n:
        raise ValueError(f"{name} must return one final reward per rollout ({n}) or None, got {result!r:.120}.")
    out = []
    for r in result:
        if not is_finite_number(r):
            raise ValueError(f"{name} returned reward {r!r}; group rewards must be finite numbers.")
        out.append(float(r))
    return out


def as_error(episode: Episode, message: str) -> Episode:
    return dataclasses.replace(episode, status="error", error=message, final_reward=math.nan, solved=False)


def _adjust(episode: Episode, reward: float, placement: str) -> Episode:
    if not episode.turns:  # no agent turn to place a change on: the reward rule keeps the reward as it was
        return episode
    delta = reward - episode.final_reward
    last = episode.turns[-1]
    last.info["group_reward"] = reward
    rewards = episode.per_token_rewards
    if delta != 0.0:
        rewards = list(rewards)
        place_reward(rewards, episode.agent_token_mask, last, delta, placement)
        last.reward += delta
    return dataclasses.replace(episode, final_reward=reward, per_token_rewards=rewards)


def group_error(env: Any, exc: BaseException) -> str:
    return f"group reward ({type(env).__name__}.{GROUP_HOOK}): {type(exc).__name__}: {exc}"


def group_steps(
    env: Any, task_data: dict[str, Any], episodes: list[Episode], *, on_error: str, clock: HookClock
) -> Generator[HookAwait, Any, list[Episode]]:
    """``episodes`` (one task's) with the env's group rewards applied (see the module docstring), their env states
    dropped and ``solved`` settled. A generator like an episode's (:func:`~.episode.episode_steps`): an async hook
    makes it yield a :class:`~.episode.HookAwait`. ``on_error="raise"`` re-raises a failing hook."""
    members = [i for i, e in enumerate(episodes) if e.status != "error"]
    out = [dataclasses.replace(e, env_state=None) if e.env_state is not None else e for e in episodes]
    if members and env.implements(GROUP_HOOK):
        name = f"{type(env).__name__}.{GROUP_HOOK}"
        try:
            states = [episodes[i].env_state for i in members]
            finals = [float(episodes[i].final_reward) for i in members]
            result = yield from hook_call(clock, GROUP_HOOK, getattr(env, GROUP_HOOK), task_data, states, finals)
            rewards = _checked(result, len(members), name)
        except Exception as exc:
            if on_error == "raise":
                raise
            for i in members:
                out[i] = as_error(out[i], group_error(env, exc))
            return settle_solved(env, out)
        if rewards is not None:
            placement = getattr(env, "reward_placement", "last")
            for i, reward in zip(members, rewards):
                out[i] = _adjust(out[i], reward, placement)
    return settle_solved(env, out)


def apply_group_rewards(
    env: Any, task_data: dict[str, Any], episodes: list[Episode], *, on_error: str = "record"
) -> list[Episode]:
    """:func:`group_steps` run to its end on this thread (an async hook awaited on the engine loop)."""
    return drive(group_steps(env, task_data, episodes, on_error=on_error, clock=HookClock()))


def settle_solved(env: Any, episodes: list[Episode]) -> list[Episode]:
    """Each episode's ``solved`` settled (in place): ``False`` for ``error``; the env's ``info["solved"]`` where it
    gave one; else ``final_reward >= env.max_reward`` when the env declares a maximum; else ``None`` (unknown)."""
    top = getattr(env, "max_reward", None)
    for e in episodes:
        if e.status == "error":
            e.solved = False
        elif e.solved is None:
            e.solved = None if top is None else bool(e.final_reward >= top or math.isclose(e.final_reward, top))
    return episodes


__all__ = ["GROUP_HOOK", "EpisodeGroup", "apply_group_rewards", "group_steps", "settle_solved"]
