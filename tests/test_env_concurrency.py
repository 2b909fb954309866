"""Environments that wait: sync hooks overlap on the worker pool, async hooks on the engine's loop, one slow or hung
env never holds back another, and time limits charge an episode only for its own time.

No test here reads a clock to decide whether hooks overlapped: overlap is shown with barriers that only open when
enough hooks are inside them at once (a serial engine would time out at the barrier and record ``error``)."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time

import pytest

from hf_rollouts import MultistepEnv, ScriptedAgent
from hf_rollouts.envs.check import check_env
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.rollout import ENGINE_LOOP, episode_jobs, run_episodes
from hf_rollouts.schema import ROLLOUT_FEATURES, to_task_dataset

HERE = __name__


class Counting(MultistepEnv):
    """Two turns: ``_step_episode`` ends the game at the second action with reward 1."""

    def _initialize_episode(self, session_id, task_data):
        return {"n": 0, **task_data}

    def _format_prompt(self, state, step):
        return f"Turn {step}. Say something."

    def _step_episode(self, session_id, state, action):
        state = {**state, "n": state["n"] + 1}
        return state, float(state["n"] == 2), state["n"] == 2, {}


class SyncMeeting(Counting):
    """Every episode's ``_initialize_episode`` waits at one barrier: it only opens when ``parties`` hooks are in it
    at the same time, i.e. when the engine runs that many sync hooks concurrently."""

    barrier: threading.Barrier

    def _initialize_episode(self, session_id, task_data):
        self.barrier.wait()
        return super()._initialize_episode(session_id, task_data)


class AsyncMeeting(Counting):
    """The same meeting with ``async def`` hooks: the barrier is a count and an event on the engine's loop."""

    parties = 0
    arrived = 0
    everyone: asyncio.Event | None = None

    async def _initialize_episode(self, session_id, task_data):
        cls = type(self)
        if cls.everyone is None:
            cls.everyone = asyncio.Event()
        cls.arrived += 1
        if cls.arrived == cls.parties:
            cls.everyone.set()
        await asyncio.wait_for(cls.everyone.wait(), 10)
        return {"n": 0, **task_data}

    async def _step_episode(self, session_id, state, action):
        await asyncio.sleep(0)
        return Counting._step_episode(self, session_id, state, action)


def _reset_async_meeting(parties: int) -> None:
    AsyncMeeting.parties, AsyncMeeting.arrived, AsyncMeeting.everyone = parties, 0, None


def test_sync_hooks_of_different_episodes_run_at_the_same_time(tokenizer):
    SyncMeeting.barrier = threading.Barrier(12, timeout=10)
    env = SyncMeeting(tokenizer, {"max_turns": 3})
    out = env.run_trial([{"task": i} for i in range(4)], ScriptedAgent(["hi"]), num_rollouts=3)
    assert out["statuses"] == ["done"] * 12, out["errors"]
    assert out["final_rewards"] == [1.0] * 12


def test_env_workers_bounds_the_sync_hooks_running_at_once(tokenizer):
    """With 4 workers, 8 hooks never meet at one barrier (it breaks), and no more than 4 ever run together."""

    class Gauge(Counting):
        lock, now, peak = threading.Lock(), 0, 0

        def _initialize_episode(self, session_id, task_data):
            cls = type(self)
            with cls.lock:
                cls.now += 1
                cls.peak = max(cls.peak, cls.now)
            time.sleep(0.02)  # long enough that a stall is seen and the waiting episodes get workers
            with cls.lock:
                cls.now -= 1
            return super()._initialize_episode(session_id, task_data)

    env = Gauge(tokenizer, {"max_turns": 3})
    jobs = episode_jobs(env, [{"t": i} for i in range(16)], 1)
    episodes = run_episodes(jobs, ScriptedAgent(["hi"]), env_workers=4)
    assert [e["status"] for e in episodes] == ["done"] * 16
    assert 1 < Gauge.peak <= 4


def test_async_hooks_are_awaited_and_overlap(tokenizer):
    _reset_async_meeting(8)
    env = AsyncMeeting(tokenizer, {"max_turns": 3})
    out = env.run_trial([{"task": i} for i in range(4)], ScriptedAgent(["hi"]), num_rollouts=2, env_workers=1)
    # one worker thread: only the event loop can have let 8 episodes wait in _initialize_episode at once
    assert out["statuses"] == ["done"] * 8, out["errors"]
    assert out["final_rewards"] == [1.0] * 8


def test_sync_and_async_envs_mix_in_one_run(tokenizer, tmp_path):
    _reset_async_meeting(2)  # the async tasks meet each other; the sync ones do not wait at all
    rows = [
        {"env_class_path": f"{HERE}.{cls.__qualname__}", "env_config": {"max_turns": 3}, "task_data": {"k": k}}
        for k, cls in enumerate([Counting, AsyncMeeting, Counting, AsyncMeeting])
    ]
    out = generate_rollouts(
        to_task_dataset(rows),
        ScriptedAgent(["hi"]),
        1,
        tokenizer=tokenizer,
        allowed_env_modules=[HERE],
        cache_dir=tmp_path,
        progress=False,
    )
    assert out["statuses"] == [["done"]] * 4, out["errors"]
    assert out["final_rewards"] == [[1.0]] * 4
    for row in range(4):  # the same episode whichever kind of hook produced it
        assert out["padded_full_token_ids"][row] == out["padded_full_token_ids"][0]


class Hangs(Counting):
    """``_step_episode`` of task ``hang`` never returns (until the test releases it); sync or async."""

    release = threading.Event()

    def _step_episode(self, session_id, state, action):
        if state.get("name") == "hang":
            self.release.wait()
        return super()._step_episode(session_id, state, action)


class AsyncHangs(Counting):
    cancelled = 0

    async def _step_episode(self, session_id, state, action):
        if state.get("name") == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                type(self).cancelled += 1
                raise
        return Counting._step_episode(self, session_id, state, action)


@pytest.mark.parametrize("env_cls", [Hangs, AsyncHangs])
def test_a_hung_hook_ends_only_its_episode_even_with_an_episode_timeout(tokenizer, env_cls):
    """The issue's case: 3 tasks, one hanging, step_timeout = episode_timeout: the healthy tasks end ``done``
    (before this, they waited behind the hung hook and were ended as ``episode_timeout`` errors)."""
    Hangs.release = threading.Event()
    AsyncHangs.cancelled = 0
    env = env_cls(tokenizer, {"max_turns": 3, "step_timeout": 1.0, "episode_timeout": 1.0})
    tasks = [{"name": "a"}, {"name": "hang"}, {"name": "b"}]
    try:
        out = env.run_trial(tasks, ScriptedAgent(["hi"]), num_rollouts=2)
    finally:
        Hangs.release.set()
    assert out["statuses"] == ["done", "done", "error", "error", "done", "done"], out["errors"]
    assert all("_step_episode ran over 1.0 s" in out["errors"][i] for i in (2, 3)), out["errors"]
    assert all(math.isnan(r) for r in out["final_rewards"][2:4])
    assert sum(out["padded_agent_token_mask"][2]) > 0  # the partial trajectory is kept
    if env_cls is AsyncHangs:
        deadline = time.monotonic() + 5
        while AsyncHangs.cancelled < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert AsyncHangs.cancelled == 2  # a hung async hook is cancelled, not left running


def test_time_waiting_behind_other_episodes_is_not_charged(tokenizer):
    """One worker, eight episodes whose hooks each take 0.1 s: the last episode waits about 0.8 s for the worker
    per phase, but its own hooks take 0.3 s in all. An episode_timeout of 0.6 s ends none of them."""

    class Slow(Counting):
        def _initialize_episode(self, session_id, task_data):
            time.sleep(0.1)
            return super()._initialize_episode(session_id, task_data)

        def _step_episode(self, session_id, state, action):
            time.sleep(0.1)
            return super()._step_episode(session_id, state, action)

    env = Slow(tokenizer, {"max_turns": 3, "episode_timeout": 0.6})
    jobs = episode_jobs(env, [{"t": i} for i in range(8)], 1)
    episodes = run_episodes(jobs, ScriptedAgent(["hi"]), env_workers=1)
    assert [e["status"] for e in episodes] == ["done"] * 8, [e["error"] for e in episodes]


def test_a_hook_that_raises_fails_only_its_own_episode(tokenizer):
    class Raises(Counting):
        async def _step_episode(self, session_id, state, action):
            if state["name"] == "bad":
                raise RuntimeError("the sandbox crashed")
            return Counting._step_episode(self, session_id, state, action)

    env = Raises(tokenizer, {"max_turns": 3})
    out = env.run_trial([{"name": "ok"}, {"name": "bad"}], ScriptedAgent(["hi"]), num_rollouts=2)
    assert out["statuses"] == ["done", "done", "error", "error"]
    assert out["errors"][2] == "RuntimeError: the sandbox crashed"
    assert out["final_rewards"][:2] == [1.0, 1.0] and all(math.isnan(r) for r in out["final_rewards"][2:])


def test_thread_safe_hooks_false_runs_one_hook_at_a_time(tokenizer):
    class Fragile(Counting):
        thread_safe_hooks = False
        inside, overlaps = 0, 0

        def _initialize_episode(self, session_id, task_data):
            cls = type(self)
            cls.inside += 1
            if cls.inside > 1:
                cls.overlaps += 1
            time.sleep(0.005)
            cls.inside -= 1
            return super()._initialize_episode(session_id, task_data)

    env = Fragile(tokenizer, {"max_turns": 3})
    out = env.run_trial([{"t": i} for i in range(8)], ScriptedAgent(["hi"]), num_rollouts=2)
    assert out["statuses"] == ["done"] * 16
    assert Fragile.overlaps == 0


class Jittery(MultistepEnv):
    """Mastermind-like guessing with random hook latencies (drawn from the global random module, so they differ
    between runs): the rows must not."""

    def _initialize_episode(self, session_id, task_data):
        time.sleep(random.random() * 0.01)
        return {"target": task_data["target"], "turn": 0}

    async def _format_prompt(self, state, step):
        await asyncio.sleep(random.random() * 0.01)
        return f"Guess my number between 0 and 9 (turn {step})."

    def _step_episode(self, session_id, state, action):
        time.sleep(random.random() * 0.01)
        won = action.strip().startswith(str(state["target"]))
        return {**state, "turn": state["turn"] + 1}, float(won), won, {}


def test_a_seeded_local_run_is_identical_whatever_the_hook_latencies(tiny, tmp_path):
    model, tokenizer = tiny
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.sampling import SamplingConfig

    rows = [
        {"env_class_path": f"{HERE}.Jittery", "env_config": {"max_turns": 3}, "task_data": {"target": t}}
        for t in range(6)
    ]
    runs = []
    for k in range(2):
        agent = TransformersAgent(model, tokenizer, SamplingConfig(max_new_tokens=4, temperature=1.0), seed=0)
        runs.append(
            generate_rollouts(
                to_task_dataset(rows),
                agent,
                3,
                seed=7,
                batch_size=3,
                allowed_env_modules=[HERE],
                cache_dir=tmp_path / str(k),
                progress=False,
            )
        )
    a, b = runs
    assert len({tuple(ids) for row in a["padded_full_token_ids"] for ids in row}) > 1  # real sampling
    for column in ROLLOUT_FEATURES:
        if column == "padded_logprobs":
            for group_a, group_b in zip(a[column], b[column]):
                for x, y in zip(group_a, group_b):
                    assert x == pytest.approx(y, abs=1e-4)
        else:
            assert a[column] == b[column], column


def test_generate_rollouts_works_inside_a_running_event_loop(tokenizer, tmp_path):
    """A notebook cell runs inside a loop: the engine must not use (or block on) the caller's loop for its hooks."""
    _reset_async_meeting(2)
    rows = [
        {"env_class_path": f"{HERE}.AsyncMeeting", "env_config": {"max_turns": 3}, "task_data": {"k": k}}
        for k in range(2)
    ]

    async def notebook_cell():
        return generate_rollouts(
            to_task_dataset(rows),
            ScriptedAgent(["hi"]),
            1,
            tokenizer=tokenizer,
            allowed_env_modules=[HERE],
            cache_dir=tmp_path,
            progress=False,
        )

    out = asyncio.run(notebook_cell())
    assert out["statuses"] == [["done"], ["done"]], out["errors"]
    assert ENGINE_LOOP.loop() is not None and not ENGINE_LOOP.in_loop_thread()


def test_check_env_plays_async_envs(tokenizer):
    class AsyncCounting(Counting):
        async def _initialize_episode(self, session_id, task_data):
            await asyncio.sleep(0)
            return {"n": 0, **task_data}

        async def _format_prompt(self, state, step):
            return f"Turn {step}."

    report = check_env(AsyncCounting, tokenizer, tasks=[{"t": 1}, {"t": 2}], env_config={"max_turns": 3})
    assert report.episodes > 0 and report.steps > 0


def test_env_workers_does_not_change_the_cache_key(tokenizer, tmp_path):
    path = f"{HERE}.Counting"
    rows = [{"env_class_path": path, "env_config": {"max_turns": 3}, "task_data": {"k": k}} for k in (1, 2)]
    common = dict(tokenizer=tokenizer, allowed_env_modules=[HERE], cache_dir=tmp_path, progress=False)
    one = generate_rollouts(to_task_dataset(rows), ScriptedAgent(["hi"]), 2, env_workers=1, **common)
    many = generate_rollouts(to_task_dataset(rows), ScriptedAgent(["hi"]), 2, env_workers=8, **common)
    other = generate_rollouts(to_task_dataset(rows), ScriptedAgent(["hi"]), 2, batch_size=1, **common)
    assert one._fingerprint == many._fingerprint != other._fingerprint
    with pytest.raises(ValueError, match="env_workers must be >= 1"):
        generate_rollouts(to_task_dataset(rows), ScriptedAgent(["hi"]), 2, env_workers=0, **common)
