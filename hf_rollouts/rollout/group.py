"""Group rewards: one env hook sees all of a task's rollouts once they have finished, before padding.

Some rewards are only defined over a group (verifiers' group rubrics rank or compare a task's
completions; a pairwise judge; a diversity bonus). After the ``num_rollouts`` episodes of one task have
ended, and before they are padded, :func:`apply_group_rewards` calls the env's
``_calculate_group_rewards(task_data, states, final_rewards)`` with the final state object and final
reward of each rollout that did not fail (``error`` rollouts are left out and stay ``error``). It
returns the new final rewards, one per state, or ``None`` to keep them.

The reward rule holds afterwards: a rollout whose final reward changes by ``delta`` gets ``delta``
added to its *last* agent turn's step reward, placed on that turn's tokens by the env's
``reward_placement`` (the last agent token by default), so ``final_reward - sum(per_token_rewards)``
is what it was before (0 for an env whose final reward is the sum of its step rewards). The turn's
info records ``group_reward``. A hook that raises, returns an awaitable that fails, or returns
anything but one finite number per state makes every rollout it was given ``error`` (NaN), with the
message; never a zero reward. The hook may be ``async def``: it is awaited on the engine's event loop
(:mod:`.aio`), where the env's async hooks ran.

Env states are kept on the episodes only for an env that overrides the hook, only until this step, and then
dropped: they never reach a dataset. An episode with no agent turn keeps its final reward (there is no turn to
place a change on).

Last, with the final rewards settled, each rollout's ``solved`` is settled (:func:`settle_solved`): the env's own
word (``info["solved"]``), else whether the final reward reached the env's ``max_reward``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .aio import resolve
from .recorder import place_reward

GROUP_HOOK = "_calculate_group_rewards"


def uses_group_hook(env: Any) -> bool:
    """Whether ``env`` overrides the group hook (the base class's default is marked ``default_hook``); only then
    are env states kept on the episodes until :func:`apply_group_rewards`, so a state holding a session, a
    subprocess or a sandbox is released when its episode ends."""
    hook = getattr(env, GROUP_HOOK, None)
    return hook is not None and not getattr(hook, "default_hook", False)


def _checked(result: Any, n: int, name: str) -> list[float] | None:
    if result is None:
        return None
    if isinstance(result, (str, bytes)) or not hasattr(result, "__len__") or len(result) != n:
        raise ValueError(f"{name} must return one final reward per rollout ({n}) or None, got {result!r:.120}.")
    out = []
    for r in result:
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
            raise ValueError(f"{name} returned reward {r!r}; group rewards must be finite numbers.")
        out.append(float(r))
    return out


def _as_error(episode: dict[str, Any], message: str) -> dict[str, Any]:
    return {**episode, "status": "error", "error": message, "final_reward": math.nan}


def _adjust(episode: dict[str, Any], reward: float, placement: str) -> dict[str, Any]:
    turns = episode.get("turns") or []
    if not turns:  # no agent turn to place a change on: the reward rule keeps the reward as it was
        return episode
    delta = reward - episode["final_reward"]
    episode = {**episode, "final_reward": reward}
    last = turns[-1]
    last.info["group_reward"] = reward
    if delta != 0.0:
        rewards = list(episode["per_token_rewards"])
        place_reward(rewards, episode["agent_token_mask"], last, delta, placement)
        last.reward += delta
        episode["per_token_rewards"] = rewards
    return episode


def apply_group_rewards(
    env: Any, task_data: dict[str, Any], episodes: list[dict[str, Any]], *, on_error: str = "record"
) -> list[dict[str, Any]]:
    """``episodes`` (one task's unpadded episode dicts) with the env's group rewards applied (see the module
    docstring) and their env states dropped. ``on_error="raise"`` re-raises a failing hook."""
    return settle_solved(env, _group_rewards(env, task_data, episodes, on_error))


def settle_solved(env: Any, episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each episode's ``solved`` settled (in place): ``False`` for ``error``; the env's ``info["solved"]`` where it
    gave one; else ``final_reward >= env.max_reward`` when the env declares a maximum; else ``None`` (unknown)."""
    top = getattr(env, "max_reward", None)
    for e in episodes:
        if e.get("status") == "error":
            e["solved"] = False
        elif e.get("solved") is None:
            e["solved"] = (
                None if top is None else bool(e["final_reward"] >= top or math.isclose(e["final_reward"], top))
            )
    return episodes


def _group_rewards(
    env: Any, task_data: dict[str, Any], episodes: list[dict[str, Any]], on_error: str
) -> list[dict[str, Any]]:
    members = [i for i, e in enumerate(episodes) if e.get("status") != "error"]
    out = [{k: v for k, v in e.items() if k != "env_state"} for e in episodes]
    if not uses_group_hook(env) or not members:
        return out
    hook = getattr(env, GROUP_HOOK)
    name = f"{type(env).__name__}.{GROUP_HOOK}"
    try:
        states = [episodes[i].get("env_state") for i in members]
        finals = [float(episodes[i]["final_reward"]) for i in members]
        rewards = _checked(resolve(hook(task_data, states, finals)), len(members), name)
    except Exception as exc:
        if on_error == "raise":
            raise
        message = f"group reward ({name}): {type(exc).__name__}: {exc}"
        for i in members:
            out[i] = _as_error(out[i], message)
        return out
    if rewards is not None:
        placement = getattr(env, "reward_placement", "last")
        for i, reward in zip(members, rewards):
            out[i] = _adjust(out[i], reward, placement)
    return out


__all__ = ["GROUP_HOOK", "apply_group_rewards", "settle_solved", "uses_group_hook"]
