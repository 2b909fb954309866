"""``check_env``: a conformance run for environment authors, in the spirit of Gymnasium's ``check_env``.

It plays a few episodes through the hooks with a scripted list of actions and checks the
contract of :class:`~hf_rollouts.envs.base.MultistepEnv`:

* ``_initialize_episode`` returns a *fresh* state each time (not the same object), unless the state is immutable
  (a ``str``, a number, ``None``, a tuple or frozenset of those, a frozen dataclass of those): one immutable object
  shared by two episodes cannot carry one episode's changes into the other, since ``_step_episode`` returns the
  next state instead of changing it;
* no episode state lives on ``self``: two episodes played interleaved, step by step, on
  one env instance give exactly what each gives alone on its own instance, and the env's
  attributes do not change while episodes run;
* hook return types: ``_format_prompt`` returns ``str``; ``_step_episode`` returns
  ``(state, reward, done, info)`` with a finite real reward, a bool ``done`` and a dict
  ``info``; ``_calculate_reward`` returns a finite real number;
* the same task played twice gives the same episode (no global randomness);
* ``async def`` hooks are awaited (on the engine's loop), like the engine does;
* a tool env's ``_call_tools`` answers a call with one :class:`~hf_rollouts.types.ToolResult` (a call to no
  such tool is an error result, not an exception); its tools were declared and its template accepted when
  the env was built;
* with ``_task_list``: tasks are deterministic under ``env_config['seed']`` and train/eval
  tasks are disjoint;
* ``validate_task_data`` accepts every task played (a check that refuses the env's own tasks would refuse
  every run up front).

Every problem found is reported together, each with what to fix, in one :class:`EnvCheckError`.
"""

from __future__ import annotations

import copy
import json
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..aio import resolve
from ..types import ToolCall, ToolResult, is_finite_number
from .base import MultistepEnv

__all__ = ["EnvCheckError", "EnvCheckReport", "check_env"]

DEFAULT_ACTIONS = ("1 2 3 4", "Is it alive?", "yes", "7", "hello", "[1]", "Is it a clock?", "left")


class EnvCheckError(AssertionError):
    """The environment breaks the hook contract; the message lists every problem and how to fix it."""


@dataclass
class EnvCheckReport:
    """What :func:`check_env` played: episodes, steps and the tasks it used."""

    env: str
    episodes: int
    steps: int
    tasks: list[dict[str, Any]] = field(default_factory=list)


IMMUTABLE_SCALARS = (str, bytes, numbers.Number, bool, type(None), range)


def is_immutable(value: Any) -> bool:
    """Whether ``value`` can never change: a str, bytes, number, bool or ``None``, or a tuple, frozenset or frozen
    dataclass whose parts are all immutable (a tuple holding a list is not: the list can change)."""
    if isinstance(value, (tuple, frozenset)):
        return all(is_immutable(part) for part in value)
    if isinstance(value, IMMUTABLE_SCALARS):
        return True
    params = getattr(type(value), "__dataclass_params__", None)
    if params is not None and params.frozen:
        return all(is_immutable(getattr(value, f.name)) for f in fields(value))
    return False


def _record(
    env: MultistepEnv, session_id: str, task: dict[str, Any], actions: Sequence[str], problems: list[str]
) -> Iterator[tuple]:
    """Play one episode through the hooks, yielding one record per hook call (so episodes can interleave)."""
    name = type(env).__name__
    state = resolve(env._initialize_episode(session_id, copy.deepcopy(task)))
    step_rewards: list[float] = []
    for step in range(min(env.max_turns, len(actions))):
        prompt = resolve(env._format_prompt(state, step))
        if not isinstance(prompt, str):
            problems.append(
                f"{name}._format_prompt(state, {step}) returned {type(prompt).__name__} ({prompt!r:.60}); "
                "it must return the message text as a str."
            )
            return
        yield ("prompt", step, prompt)
        result = resolve(env._step_episode(session_id, state, actions[step]))
        if not (isinstance(result, tuple) and len(result) == 4):
            problems.append(
                f"{name}._step_episode returned {type(result).__name__} ({result!r:.60}); "
                "it must return the tuple (state, reward, done, info)."
            )
            return
        state, reward, done, info = result
        if not is_finite_number(reward):
            problems.append(
                f"{name}._step_episode returned reward {reward!r} at step {step}; it must be a finite real number "
                "(NaN and inf are not rewards: raise an exception for a failed step instead)."
            )
            return
        if not isinstance(done, bool):
            problems.append(f"{name}._step_episode returned done={done!r} ({type(done).__name__}); return a bool.")
            return
        if not isinstance(info, dict):
            problems.append(
                f"{name}._step_episode returned info of type {type(info).__name__}; return a dict (may be empty)."
            )
            return
        truncated = info.get("truncated", False)
        if not isinstance(truncated, bool) or (truncated and not done):
            problems.append(
                f"{name}._step_episode returned info['truncated']={truncated!r} with done={done!r} at step {step}; "
                "info['truncated'] must be a bool, and True only together with done=True (the env's own limit "
                "ended the episode)."
            )
            return
        step_rewards.append(float(reward))
        yield ("step", step, float(reward), done, json.dumps(info, sort_keys=True, default=repr))
        if done:
            break
    final = resolve(env._calculate_reward(state, step_rewards))
    if not is_finite_number(final):
        problems.append(f"{name}._calculate_reward returned {final!r}; it must be a finite real number.")
        return
    yield ("final", float(final))


def _play(
    env: MultistepEnv, session_id: str, task: dict[str, Any], actions: Sequence[str], problems: list[str]
) -> list[tuple]:
    return list(_record(env, session_id, task, actions, problems))


def _interleaved(
    env: MultistepEnv, tasks: list[dict[str, Any]], actions: Sequence[str], problems: list[str]
) -> list[list[tuple]]:
    """Play ``tasks`` on one env instance, advancing each episode by one hook call in turn."""
    runs = [_record(env, f"interleaved{i}", t, actions, problems) for i, t in enumerate(tasks)]
    out: list[list[tuple]] = [[] for _ in tasks]
    live = list(range(len(tasks)))
    while live:
        for i in list(live):
            try:
                out[i].append(next(runs[i]))
            except StopIteration:
                live.remove(i)
    return out


def _attributes(env: MultistepEnv) -> dict[str, str]:
    """A cheap view of the env's attributes: values of plain ones, sizes of containers."""
    view = {}
    for key, value in vars(env).items():
        if isinstance(value, (str, numbers.Number, bool, type(None))):
            view[key] = repr(value)
        elif isinstance(value, (list, dict, set, tuple)):
            view[key] = f"{type(value).__name__} of {len(value)}"
        else:
            view[key] = type(value).__name__
    return view


def _split_tasks(
    env_cls: type[MultistepEnv], tokenizer: PreTrainedTokenizerBase, config: dict, n: int
) -> tuple[list, list]:
    env = env_cls(tokenizer, config)
    return env._task_list("train", n), env._task_list("eval", n)


def check_env(
    env_cls: type[MultistepEnv],
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[dict[str, Any]] | None = None,
    *,
    env_config: dict[str, Any] | None = None,
    actions: Sequence[str] = DEFAULT_ACTIONS,
    num_tasks: int = 3,
) -> EnvCheckReport:
    """Check ``env_cls`` against the hook contract (see the module docstring); raise :class:`EnvCheckError` if broken.

    Args:
        env_cls: the environment class.
        tokenizer: a tokenizer with a chat template (e.g. ``hf_rollouts.tiny_model.build_tokenizer()``).
        tasks: ``task_data`` dicts to play; default: ``num_tasks`` from the env's ``_task_list("train")``.
        env_config: the config to build the env with.
        actions: the scripted agent's actions, one per turn (episodes stop at ``max_turns``).
        num_tasks: how many tasks to take from ``_task_list`` when ``tasks`` is not given.
    """
    config = dict(env_config or {})
    name = env_cls.__name__
    problems: list[str] = []
    try:
        env = env_cls(tokenizer, config)
    except Exception as exc:
        raise EnvCheckError(
            f"{name}(tokenizer, {config!r}) raised {type(exc).__name__}: {exc}. The constructor must accept "
            "(tokenizer, env_config) and call super().__init__(tokenizer, env_config)."
        ) from exc
    has_tasks = type(env)._task_list is not MultistepEnv._task_list
    if has_tasks:
        try:
            train, evaluation = _split_tasks(env_cls, tokenizer, config, num_tasks)
        except NotImplementedError:  # tasks need configuration this config lacks (e.g. a dataset path)
            has_tasks = False
    if has_tasks:
        again = _split_tasks(env_cls, tokenizer, config, num_tasks)
        if (train, evaluation) != again:
            problems.append(
                f"{name}._task_list gives different tasks for the same env_config; draw from self._rng(...) "
                "(seeded by env_config['seed']), never from the global random module."
            )
        key = lambda t: json.dumps(t, sort_keys=True, default=repr)  # noqa: E731
        if {key(t) for t in train} & {key(t) for t in evaluation}:
            problems.append(f"{name}._task_list('train') and ('eval') share tasks; make the splits disjoint.")
        if tasks is None:
            tasks = train
    if not tasks:
        raise EnvCheckError(
            f"{name} has no _task_list, so check_env needs tasks: check_env({name}, tokenizer, tasks=[task_data, ...])."
        )
    tasks = [dict(t) for t in tasks][:num_tasks] if len(tasks) > num_tasks else [dict(t) for t in tasks]
    for task in tasks:
        try:
            env.validate_task_data(copy.deepcopy(task))
        except Exception as exc:
            problems.append(
                f"{name}.validate_task_data refuses the task {task!r:.80} ({type(exc).__name__}: {exc}); it must "
                "accept every task the env plays (runs call it on every row before any episode)."
            )

    first = resolve(env._initialize_episode("fresh0", copy.deepcopy(tasks[0])))
    second = resolve(env._initialize_episode("fresh1", copy.deepcopy(tasks[0])))
    if first is second and not is_immutable(first):
        problems.append(
            f"{name}._initialize_episode returned the same {type(first).__name__} object twice; return a new object "
            "per episode (episodes of one env run concurrently, and a mutable state shared by two of them carries one "
            "episode's changes into the other), or an immutable state (str, number, tuple, frozen dataclass)."
        )

    if env.toolbox is not None:  # a tool env: _call_tools answers every call with one ToolResult, never raising
        probe = ToolCall("__check_env_no_such_tool__", {}, id="call_check")
        state = env._initialize_episode("tools", copy.deepcopy(tasks[0]))
        answer = env._call_tools("tools", state, [probe])
        if not (isinstance(answer, list) and len(answer) == 1 and isinstance(answer[0], ToolResult)):
            problems.append(
                f"{name}._call_tools returned {answer!r:.80} for one call; it must return one ToolResult per call "
                "(hf_rollouts.tools.run_tool_calls does)."
            )

    before = _attributes(env)
    alone = [_play(env_cls(tokenizer, config), f"alone{i}", t, actions, problems) for i, t in enumerate(tasks)]
    repeat = [_play(env_cls(tokenizer, config), f"alone{i}", t, actions, problems) for i, t in enumerate(tasks)]
    together = _interleaved(env, tasks, actions, problems)
    if not problems:
        for i, task in enumerate(tasks):
            if alone[i] != repeat[i]:
                problems.append(
                    f"{name}: the same task played twice gave different episodes ({task!r:.60}); draw randomness from "
                    "the state or self._rng(...), never the global random module."
                )
            elif alone[i] != together[i]:
                at = next((k for k, (a, b) in enumerate(zip(alone[i], together[i])) if a != b), None)
                problems.append(
                    f"{name}: episodes interleaved on one env instance differ from the same episodes played alone "
                    f"(task {task!r:.60}, record {at}). Episode state must live in the object _initialize_episode "
                    "returns, never on self: episodes of one env run concurrently."
                )
        changed = sorted(k for k in set(before) | set(_attributes(env)) if before.get(k) != _attributes(env).get(k))
        if changed:
            problems.append(
                f"{name}: attributes {changed} of the env changed while episodes ran; keep episode state in the "
                "state object, never on self."
            )
    if problems:
        raise EnvCheckError(f"{name} fails the environment contract:\n- " + "\n- ".join(dict.fromkeys(problems)))
    steps = sum(1 for run in alone for rec in run if rec[0] == "step")
    return EnvCheckReport(env=name, episodes=3 * len(tasks), steps=steps, tasks=list(tasks))
