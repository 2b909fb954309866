"""The rollout engine: answer order does not matter, time limits end only the episodes that run over."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from concurrent.futures import Future

import pytest

from hf_rollouts import MultistepEnv, ScriptedAgent
from hf_rollouts.agents.base import Agent
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import RolloutOptions, generate_rollouts
from hf_rollouts.rollout import episode_jobs, run_episodes
from hf_rollouts.schema import ROLLOUT_FEATURES
from hf_rollouts.types import Action


class ShuffledServer(Agent):
    """A per-request agent (like an inference server) whose answers arrive in random order after random delays.

    The answer to a request depends only on the request (its session and turn), as a seeded server's would."""

    answers_per_request = True

    def __init__(self, delay: float, seed: int = 0) -> None:
        self.delay, self.rng, self.lock = delay, random.Random(seed), threading.Lock()
        self.calls = 0

    def get_action(self, messages, agent_state=None):  # pragma: no cover - submit/act are used
        raise NotImplementedError

    def _answer(self, request) -> tuple[Action, object]:
        turn = sum(m["role"] == "assistant" for m in request.messages)
        digits = random.Random(f"{request.session_id}|{turn}").choices("123456", k=4)
        return Action(text=" ".join(digits)), request.agent_state

    def act(self, request):
        return self._answer(request)

    def submit(self, request) -> Future:
        with self.lock:
            self.calls += 1
            wait = self.rng.random() * self.delay
        future: Future = Future()
        threading.Timer(wait, lambda: future.set_result(self._answer(request))).start()
        return future


def _tasks(tokenizer, n=6):
    return MastermindEnv(tokenizer, {"max_turns": 4, "num_symbols": 6}).get_train_dataset(n)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_answer_order_does_not_change_the_rows(tokenizer, tmp_path):
    tasks = _tasks(tokenizer)
    common = dict(tokenizer=tokenizer, progress=False, seed=3, batch_size=2, shard_size=4)
    instant = generate_rollouts(tasks, ShuffledServer(0.0), 3, cache_dir=tmp_path / "a", **common)
    shuffled = ShuffledServer(0.02, seed=1)
    late = generate_rollouts(tasks, shuffled, 3, cache_dir=tmp_path / "b", **common)
    assert shuffled.calls > len(tasks) * 3  # multi-turn: several requests per episode, answered out of order
    for column in ROLLOUT_FEATURES:
        assert _same(instant[column], late[column]), column
    assert set(s for row in late["statuses"] for s in row) <= {"done", "truncated"}


class SometimesHangs(MultistepEnv):
    """A tiny env whose step hangs forever for task 'hang' (until the test releases it)."""

    release = threading.Event()

    def _initialize_episode(self, session_id, task_data):
        return dict(task_data)

    def _format_prompt(self, state, step):
        return "Say something."

    def _step_episode(self, session_id, state, action):
        if state["name"] == "hang":
            self.release.wait()
        return state, 1.0, True, {}


def test_a_hung_step_ends_only_its_episode_within_the_limit(tokenizer):
    SometimesHangs.release = threading.Event()
    env = SometimesHangs(tokenizer, {"max_turns": 2, "step_timeout": 0.5})
    tasks = [{"name": "a"}, {"name": "hang"}, {"name": "b"}]
    start = time.monotonic()
    try:
        out = env.run_trial(tasks, ScriptedAgent(["hi"]), num_rollouts=2)
    finally:
        elapsed = time.monotonic() - start
        SometimesHangs.release.set()  # let the abandoned daemon thread finish
    assert out["statuses"] == ["done", "done", "error", "error", "done", "done"]
    assert all("step_timeout: _step_episode ran over 0.5 s" in out["errors"][i] for i in (2, 3))
    assert out["final_rewards"][:2] == [1.0, 1.0] and out["final_rewards"][4:] == [1.0, 1.0]
    assert all(math.isnan(r) for r in out["final_rewards"][2:4])
    # the partial trajectory is kept: the prompt and the agent's turn before the hang
    assert sum(out["padded_agent_token_mask"][2]) > 0
    assert elapsed < 0.5 * 2 + 10  # two hung episodes, one after the other, plus a generous margin


class NeverAnswers(ShuffledServer):
    def submit(self, request) -> Future:
        return Future()  # a server that never answers


def test_episode_timeout_while_waiting_for_the_agent(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 3, "episode_timeout": 0.3})
    jobs = episode_jobs(env, [{"code": [1, 2, 3, 4]}], 2)
    episodes = run_episodes(jobs, NeverAnswers(0.0))
    assert [e["status"] for e in episodes] == ["error", "error"]
    assert all(e["error"].startswith("EpisodeTimeout: episode_timeout: the episode ran over 0.3 s") for e in episodes)
    assert all(math.isnan(e["final_reward"]) for e in episodes)


def test_run_defaults_apply_and_env_config_wins(tokenizer):
    SometimesHangs.release = threading.Event()
    default = SometimesHangs(tokenizer, {"max_turns": 1})
    own = SometimesHangs(tokenizer, {"max_turns": 1, "step_timeout": 0.3})
    jobs = episode_jobs(default, [{"name": "hang"}], 1) + episode_jobs(own, [{"name": "hang"}], 1, start=1)
    try:
        episodes = run_episodes(jobs, ScriptedAgent(["x"]), step_timeout=0.2)
    finally:
        SometimesHangs.release.set()
    assert "step_timeout: _step_episode ran over 0.2 s" in episodes[0]["error"]
    assert "step_timeout: _step_episode ran over 0.3 s" in episodes[1]["error"]


def test_refill_keeps_at_most_max_concurrency_alive(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    seen: list[int] = []

    class Counting(ScriptedAgent):
        def act_batch(self, requests):
            seen.append(len(requests))
            return super().act_batch(requests)

    jobs = episode_jobs(env, [{"code": [1, 2, 3, 4]}, {"code": [6, 6, 6, 6]}], 3)
    out = run_episodes(jobs, Counting(["1 2 3 4"]), max_concurrency=4)
    assert max(seen) == 4 and sum(seen) == 3 + 3 * 2  # task 0 solves in one turn, task 1 plays two
    assert [e["status"] for e in out] == ["done"] * 3 + ["truncated"] * 3  # job order, whatever the finish order


def test_timeout_options_are_validated():
    with pytest.raises(ValueError, match="step_timeout must be a number of seconds"):
        RolloutOptions(num_rollouts=1, step_timeout=-1)


def test_request_seeds_depend_on_row_rollout_and_turn_only(tokenizer, tmp_path):
    """Every request's seed is a function of (run seed, task row, rollout, turn): the same under any batching."""
    seen: dict[str, dict[tuple[str, int], int]] = {}

    class Seeds(ShuffledServer):
        def _answer(self, request):
            turn = sum(m["role"] == "assistant" for m in request.messages)
            seen[self.label][(request.session_id, turn)] = request.seed
            return super()._answer(request)

    tasks = _tasks(tokenizer)
    for label, kw in [("a", dict(batch_size=1, shard_size=1)), ("b", dict(batch_size=4, shard_size=6))]:
        agent = Seeds(0.0)
        agent.label = label
        seen[label] = {}
        generate_rollouts(
            tasks, agent, 2, tokenizer=tokenizer, progress=False, seed=5, cache_dir=tmp_path / label, **kw
        )
    assert seen["a"] == seen["b"] and len(seen["a"]) > len(tasks) * 2
    assert len(set(seen["a"].values())) == len(seen["a"])  # distinct per row, rollout and turn


@pytest.mark.parametrize("reuse_kv", [True, False])
def test_the_local_agent_samples_the_same_rows_under_any_batching(tiny, reuse_kv, tmp_path):
    """The guarantee for TransformersAgent (generate backend): each request samples from the random stream of its
    own seed, so rows do not depend on batch_size, max_concurrency or shard_size. (Log-probs may differ in the last
    bits, since batched float arithmetic depends on the batch's shape; a sampled id could then only differ when a
    draw falls within that rounding of a boundary.)"""
    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    tasks = _tasks(tok, n=5)
    runs = []
    for kw in [
        dict(batch_size=1, shard_size=1),
        dict(batch_size=5, shard_size=5),
        dict(batch_size=2, max_concurrency=3),
    ]:
        agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=8, seed=0, reuse_kv=reuse_kv)
        runs.append(generate_rollouts(tasks, agent, 2, progress=False, seed=7, cache_dir=tmp_path / str(kw), **kw))
    first = runs[0]
    assert len({tuple(ids) for row in first["padded_full_token_ids"] for ids in row}) > 1  # real sampling
    for other in runs[1:]:
        for column in ROLLOUT_FEATURES:
            if column == "padded_logprobs":
                for group_a, group_b in zip(first[column], other[column]):
                    for a, b in zip(group_a, group_b):
                        assert a == pytest.approx(b, abs=1e-4)
            else:
                assert _same(first[column], other[column]), column


def test_an_interrupt_waits_for_the_agents_call_to_return(tokenizer):
    """Ctrl-C while a client-batching agent generates: run_episodes re-raises only once act_batch has returned, so
    the caller (the TRL bridge) never restores the model while it is still sampling in the driver thread."""
    import os
    import signal

    calls = {"started": threading.Event(), "done": False}

    class Slow(ScriptedAgent):
        def act_batch(self, requests):
            calls["started"].set()
            time.sleep(0.3)
            calls["done"] = True
            return super().act_batch(requests)

    env = MastermindEnv(tokenizer, {"max_turns": 2, "num_symbols": 6})
    jobs = episode_jobs(env, [{"code": [1, 2, 3, 4]}], 2)
    # a shell that starts the suite in the background ignores SIGINT in it: restore Python's own handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=lambda: (calls["started"].wait(), os.kill(os.getpid(), signal.SIGINT))).start()
        with pytest.raises(KeyboardInterrupt):
            run_episodes(jobs, Slow(["1 2 3 4"]))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls["done"]


def test_a_reused_driver_follows_the_callers_torch_thread_count(tokenizer):
    """torch's thread count is per thread once used; the engine's reused driver threads must follow the caller's."""
    import torch

    seen = []

    class Probe(ScriptedAgent):
        def act_batch(self, requests):
            seen.append(torch.get_num_threads())
            return super().act_batch(requests)

    env = MastermindEnv(tokenizer, {"max_turns": 1, "num_symbols": 6})
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            run_episodes(episode_jobs(env, [{"code": [1, 2, 3, 4]}], 1), Probe(["1 2 3 4"]))
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2, 1]


class Holds(MultistepEnv):
    """Each episode holds a resource (``open``) until ``_close_episode``; the task's ``end`` says how it ends."""

    release = threading.Event()

    def __init__(self, tokenizer, env_config=None):
        super().__init__(tokenizer, env_config)
        self.open, self.closed, self.lock = set(), [], threading.Lock()

    def _initialize_episode(self, session_id, task_data):
        if task_data["end"] == "init":
            raise RuntimeError("init broke")
        with self.lock:
            self.open.add(session_id)
        return dict(task_data, sid=session_id)

    def _format_prompt(self, state, step):
        return "Say something."

    def _step_episode(self, session_id, state, action):
        end = state["end"]
        if end == "step":
            raise RuntimeError("step broke")
        if end == "hang":
            self.release.wait()
        if end == "cut":
            return state, 0.0, False, {}
        return state, (math.nan if end == "reward" else 1.0), True, {}

    def _calculate_reward(self, state, step_rewards):
        if state["end"] == "final":
            raise ValueError("final broke")
        return sum(step_rewards)

    def _close_episode(self, session_id, state):
        with self.lock:
            self.open.discard(state["sid"])
            self.closed.append(state["sid"])
        if state["end"] == "close":
            raise OSError("close broke")


class AsyncHolds(Holds):
    async def _step_episode(self, session_id, state, action):
        if state["end"] == "hang":
            await asyncio.sleep(3600)  # cancelled by step_timeout
        return Holds._step_episode(self, session_id, state, action)

    async def _close_episode(self, session_id, state):
        await asyncio.sleep(0)
        return Holds._close_episode(self, session_id, state)


ENDINGS = {
    "ok": ("done", None),
    "cut": ("truncated", None),  # our max_turns
    "step": ("error", "step broke"),
    "reward": ("error", "the step reward"),
    "final": ("error", "final broke"),
    "hang": ("error", "step_timeout: _step_episode ran over 0.5 s"),
    "close": ("done", None),  # becomes error: the close failed
    "init": ("error", "init broke"),
}


@pytest.mark.parametrize("cls", [Holds, AsyncHolds])
def test_every_ending_releases_the_episode_once(cls, tokenizer):
    """_close_episode runs once for every episode whose state exists, whatever ended it, and (except for a sync hook
    the watchdog abandoned) before the run returns; a failing close makes the episode an error."""
    cls.release = threading.Event()
    env = cls(tokenizer, {"max_turns": 2, "step_timeout": 0.5})
    jobs = episode_jobs(env, [{"end": end} for end in ENDINGS], 2)
    try:
        episodes = run_episodes(jobs, ScriptedAgent(["hi"]), max_concurrency=3)
        if cls is AsyncHolds:
            assert env.open == set()  # every close was awaited before its episode finished
    finally:
        cls.release.set()
    deadline = time.monotonic() + 30
    while env.open and time.monotonic() < deadline:  # the abandoned sync hook returns, then its episode is closed
        time.sleep(0.01)
    started = [j.session_id for j in jobs if j.task_data["end"] != "init"]
    assert env.open == set() and sorted(env.closed) == sorted(started)  # each exactly once; a failed init none
    for job, ep in zip(jobs, episodes):
        status, message = ENDINGS[job.task_data["end"]]
        if job.task_data["end"] == "close":
            status, message = "error", "_close_episode failed: OSError: close broke"
        assert ep["status"] == status and (message is None or message in ep["error"]), (job.task_data, ep["error"])


def test_on_error_raise_still_releases(tokenizer):
    env = Holds(tokenizer, {"max_turns": 2})
    with pytest.raises(RuntimeError, match="step broke"):
        env._run_complete_episode("s", ScriptedAgent(["hi"]), {"end": "step"}, on_error="raise")
    assert env.closed == ["s"] and env.open == set()


class SlowGroupHook(MultistepEnv):
    """One turn, reward 1; the group hook of task ``slow`` takes 30 s (sync or async), of the others none."""

    release = threading.Event()

    def _initialize_episode(self, session_id, task_data):
        return dict(task_data)

    def _format_prompt(self, state, step):
        return "Say something."

    def _step_episode(self, session_id, state, action):
        return state, 1.0, True, {}

    def _calculate_group_rewards(self, task_data, states, final_rewards):
        if task_data["name"] == "slow":
            self.release.wait(30)
        return [2.0] * len(states)


class AsyncSlowGroupHook(SlowGroupHook):
    async def _calculate_group_rewards(self, task_data, states, final_rewards):
        if task_data["name"] == "slow":
            await asyncio.sleep(30)
        return [2.0] * len(states)


@pytest.mark.parametrize("cls", [SlowGroupHook, AsyncSlowGroupHook])
def test_a_group_hook_past_step_timeout_fails_only_its_group(cls, tokenizer):
    """Group rewards run inside the engine under step_timeout: a hook that hangs ends its group as error (a sync one
    abandoned, an async one cancelled), and the other groups get theirs."""
    cls.release = threading.Event()
    env = cls(tokenizer, {"max_turns": 1, "step_timeout": 0.5})
    try:
        out = env.run_trial([{"name": "a"}, {"name": "slow"}, {"name": "b"}], ScriptedAgent(["hi"]), num_rollouts=2)
    finally:
        cls.release.set()
    assert out["statuses"] == ["done", "done", "error", "error", "done", "done"]
    assert out["final_rewards"][:2] == [2.0, 2.0] and out["final_rewards"][4:] == [2.0, 2.0]
    message = f"group reward ({cls.__name__}._calculate_group_rewards): EpisodeTimeout: step_timeout"
    assert all(out["errors"][i].startswith(message) for i in (2, 3)), out["errors"]


class Relay(MultistepEnv):
    """Task ``late``'s step waits (up to 20 s) until task ``early``'s group hook has run: only an engine that applies
    group rewards as each group finishes lets it see that (else it gives reward 0 after the wait)."""

    scored = threading.Event()

    def _initialize_episode(self, session_id, task_data):
        return dict(task_data)

    def _format_prompt(self, state, step):
        return "Say something."

    def _step_episode(self, session_id, state, action):
        if state["name"] == "late":
            return state, float(self.scored.wait(20)), True, {}
        return state, 1.0, True, {}

    def _calculate_group_rewards(self, task_data, states, final_rewards):
        if task_data["name"] == "early":
            type(self).scored.set()
        return None


def test_group_rewards_are_applied_as_each_group_finishes(tokenizer):
    Relay.scored = threading.Event()
    env = Relay(tokenizer, {"max_turns": 1})
    out = env.run_trial([{"name": "early"}, {"name": "late"}], ScriptedAgent(["hi"]), num_rollouts=2)
    assert out["final_rewards"] == [1.0, 1.0, 1.0, 1.0], out["errors"]


def test_a_blocking_call_into_the_engine_loop_from_the_loop_raises_instead_of_hanging():
    from hf_rollouts.aio import ENGINE_LOOP

    async def inner():
        return 1

    async def outer():
        return ENGINE_LOOP.call(inner())

    with pytest.raises(RuntimeError, match="from the loop itself"):
        ENGINE_LOOP.call(outer(), timeout=10)
    assert ENGINE_LOOP.call(inner()) == 1


def test_the_offload_policy_learns_per_env_class():
    from hf_rollouts.rollout.workers import OffloadPolicy

    policy = OffloadPolicy()
    assert not policy.blocks(Holds) and policy.look == OffloadPolicy.STALL
    policy.progressed()
    policy.progressed()
    assert policy.look == 4 * OffloadPolicy.STALL
    for _ in range(10):
        policy.progressed()
    assert policy.look == OffloadPolicy.LOOK_MAX  # a busy, progressing worker is looked at rarely
    policy.stalled({Holds})
    assert policy.blocks(Holds) and not policy.blocks(AsyncHolds) and policy.look == OffloadPolicy.STALL


def test_episodes_stay_typed_and_their_dicts_hold_no_env_state(tokenizer):
    from hf_rollouts.rollout import play_groups, task_groups
    from hf_rollouts.types import Episode

    env = SlowGroupHook(tokenizer, {"max_turns": 1})
    (group,) = play_groups(task_groups(env, [{"name": "a"}], 2), ScriptedAgent(["hi"]))
    assert all(isinstance(e, Episode) and e.env_state is None for e in group.episodes)
    assert [e.final_reward for e in group.episodes] == [2.0, 2.0]
    d = group.episodes[0].to_dict()
    assert "env_state" not in d and Episode.from_dict(d) == group.episodes[0]


class ReturnsWhenReleased(MultistepEnv):
    """A step that runs until the test lets it return."""

    release = threading.Event()

    def _initialize_episode(self, session_id, task_data):
        return None

    def _format_prompt(self, state, step):
        return "Say something."

    def _step_episode(self, session_id, state, action):
        self.release.wait(30)
        return state, 1.0, True, {}


def test_a_hook_that_returns_while_the_time_limit_is_read_ends_only_its_episode(tokenizer, monkeypatch):
    """Issue 36, item 3: the engine read the clock's verdict twice; a hook that returned between the two reads left
    the episode timed out without a message, and Episode.check ("status 'error' iff an error message") raised inside
    the engine, which stopped the run. The hook is made to return at that moment: while the first read runs."""
    from hf_rollouts.rollout.episode import HookClock

    ReturnsWhenReleased.release = threading.Event()
    returned = threading.Event()
    overrun, end = HookClock.overrun, HookClock.end

    def ending(clock):
        stepped = clock.activity == "_step_episode"
        cancelled = end(clock)
        if stepped:
            returned.set()
        return cancelled

    def overrun_with_a_return(clock, now):
        message = overrun(clock, now)
        if message is not None and not ReturnsWhenReleased.release.is_set():
            ReturnsWhenReleased.release.set()  # the hook returns now ...
            returned.wait(1.0)  # ... and its end is recorded (or waits for the verdict, if the clock holds it)
        return message

    monkeypatch.setattr(HookClock, "overrun", overrun_with_a_return)
    monkeypatch.setattr(HookClock, "end", ending)
    env = ReturnsWhenReleased(tokenizer, {"max_turns": 1, "step_timeout": 0.2})
    episodes = run_episodes(episode_jobs(env, [{}], 1), ScriptedAgent(["hi"]))
    assert len(episodes) == 1
    [episode] = episodes
    if episode["status"] == "error":  # the verdict came first: the hook's late result is dropped
        assert "step_timeout: _step_episode ran over 0.2 s" in episode["error"]
    else:  # the hook returned first: its result stands
        assert episode["status"] == "done" and episode["final_reward"] == 1.0
