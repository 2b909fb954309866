"""OpenEnv adapter against a real OpenEnv server (openenv-core's create_app) served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import math
import random
import re
import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core.env_server")
uvicorn = pytest.importorskip("uvicorn")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.envs.check import check_env  # noqa: E402
from hf_rollouts.envs.openenv import OpenEnvEnv  # noqa: E402
from hf_rollouts.pipeline import generate_rollouts  # noqa: E402
from hf_rollouts.schema import TaskValidationError, to_task_dataset  # noqa: E402


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str = ""
    truncated: bool = False  # openenv-core 0.3 servers drop metadata from the wire: say it in a field


class GuessEnv(Environment):
    """Guess a number in 1..15 with higher/lower hints; 4 guesses. Its own turn limit reports truncated."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="", step_count=0)
        self.target = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.target = random.Random(seed).randint(1, 15)
        self._state = State(episode_id=episode_id or "", step_count=0)
        return GuessObservation(text="Guess a number between 1 and 15.", done=False, reward=None)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.search(r"-?\d+", action.message)
        guess = int(found.group()) if found else None
        if guess == self.target:
            return GuessObservation(text="Correct!", done=True, reward=1.0)
        if self._state.step_count >= 4:
            return GuessObservation(text="Out of guesses.", done=True, reward=0.0, truncated=True)
        hint = "No number found." if guess is None else ("Higher." if guess < self.target else "Lower.")
        return GuessObservation(text=hint, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class Serial(GuessEnv):
    SUPPORTS_CONCURRENT_SESSIONS = False


def _serve(env_cls, max_envs):
    app = create_app(env_cls, GuessAction, GuessObservation, max_concurrent_envs=max_envs)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server_url():
    server, thread, url = _serve(GuessEnv, 64)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def bisect_solver(messages):
    """Plays binary search from the hints: a scripted agent that solves the task in at most 4 guesses."""
    low, high = 1, 15
    for guess_msg, hint in zip(messages[1::2], messages[2::2]):
        guess = int(guess_msg["content"])
        if hint["content"].startswith("Higher"):
            low = guess + 1
        elif hint["content"].startswith("Lower"):
            high = guess - 1
    return str((low + high) // 2)


def scripted(fn, tokenizer):
    agent = ScriptedAgent(fn)
    agent.tokenizer = tokenizer
    return agent


def test_scripted_solver_over_concurrent_sessions(server_url, tokenizer, tmp_path):
    tasks = OpenEnvEnv(tokenizer, {"base_url": server_url}).get_train_dataset(6)
    out = generate_rollouts(tasks, scripted(bisect_solver, tokenizer), 4, cache_dir=tmp_path, progress=False,
                            allowed_env_models=[server_url])  # fmt: skip
    statuses = [s for row in out["statuses"] for s in row]
    rewards = [r for row in out["final_rewards"] for r in row]
    assert statuses == ["done"] * 24 and rewards == [1.0] * 24  # 24 sessions at once on one server
    conversation = out[0]["conversations"][0]
    assert conversation[0]["content"] == "Guess a number between 1 and 15."


def test_env_turn_limit_is_truncated_and_tiny_model_plays(server_url, tiny, tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    env = OpenEnvEnv(tok, {"base_url": server_url})
    ep = env._run_complete_episode("s", ScriptedAgent(["nothing"]), {"seed": 3})
    assert ep["status"] == "truncated" and ep["num_turns"] == 4 and ep["final_reward"] == 0.0
    tasks = env.get_eval_dataset(3)
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=8, seed=0)
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path, progress=False, allowed_env_models=[server_url])
    statuses = [s for row in out["statuses"] for s in row]
    assert set(statuses) <= {"done", "truncated"} and len(statuses) == 6
    assert all(math.isfinite(r) for row in out["final_rewards"] for r in row)


def test_episodes_we_end_first_free_their_session_at_once(tokenizer, tmp_path):
    """Our max_turns (2) below the server's limit: each cut episode closes its session when it ends, so a server
    with as many slots as episodes alive at once (4) serves 16 episodes without CAPACITY_REACHED."""
    server, thread, url = _serve(GuessEnv, 4)
    try:
        tasks = OpenEnvEnv(tokenizer, {"base_url": url, "max_turns": 2}).get_train_dataset(4)
        out = generate_rollouts(tasks, scripted(lambda m: "0", tokenizer), 4, cache_dir=tmp_path, progress=False,
                                allowed_env_models=[url], max_concurrency=4)  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert [s for row in out["statuses"] for s in row] == ["truncated"] * 16, out["errors"]


class Flaky(GuessEnv):
    """The seed picks how an episode ends: 0 plays normally; 1 reset raises; 2 every step raises; 3 a step answers a
    reward that is not a number (true)."""

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        if seed % 4 == 1:
            raise RuntimeError("reset broke")
        self.kind = seed % 4
        return super().reset(seed=seed, episode_id=episode_id, **kwargs)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        if self.kind == 2:
            raise RuntimeError("step broke")
        if self.kind == 3:
            return GuessObservation(text="?", done=False, reward=True)
        return super().step(action, timeout_s=timeout_s, **kwargs)


def test_every_ending_frees_its_session_at_full_concurrency(tokenizer, tmp_path):
    """Failing resets, steps and rewards end their episodes as errors and close their sessions before the next
    episode starts: a server with exactly as many slots as episodes alive at once (4) refuses none of 48."""
    server, thread, url = _serve(Flaky, 4)
    try:
        rows = [{"env_class_path": "hf_rollouts.envs.openenv.OpenEnvEnv", "env_config": {"base_url": url},
                 "task_data": {"seed": seed}} for seed in range(16)]  # fmt: skip
        out = generate_rollouts(to_task_dataset(rows), scripted(bisect_solver, tokenizer), 3, cache_dir=tmp_path,
                                progress=False, allowed_env_models=[url], max_concurrency=4)  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    errors = [e for row in out["errors"] for e in row if e]
    assert not [e for e in errors if "CAPACITY_REACHED" in e or "ConnectionClosed" in e], errors
    expected = {0: "done", 1: "reset failed", 2: "step failed", 3: "not a number"}
    for seed, statuses, row_errors in zip(range(16), out["statuses"], out["errors"]):
        if seed % 4 == 0:
            assert statuses == ["done"] * 3, row_errors
        else:
            assert statuses == ["error"] * 3 and all(expected[seed % 4] in e for e in row_errors), row_errors


class Frozen(GuessEnv):
    """A server whose steps hang (for 2 s here)."""

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        threading.Event().wait(2.0)
        return super().step(action, timeout_s=timeout_s, **kwargs)


def test_a_frozen_server_names_itself_and_the_timeout_that_ran_out(tokenizer):
    server, thread, url = _serve(Frozen, 4)
    try:
        env = OpenEnvEnv(tokenizer, {"base_url": url, "message_timeout": 0.5})
        ep = env._run_complete_episode("s", ScriptedAgent(["7"]), {"seed": 1})
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert ep["status"] == "error" and url in ep["error"] and "step failed: TimeoutError." in ep["error"]
    assert "message_timeout=0.5 s" in ep["error"] and "env_config['message_timeout']" in ep["error"]


def test_check_env(server_url, tokenizer):
    assert check_env(OpenEnvEnv, tokenizer, env_config={"base_url": server_url}).steps > 0


def test_endpoint_must_be_allowed(server_url, tokenizer, tmp_path):
    tasks = OpenEnvEnv(tokenizer, {"base_url": server_url}).get_train_dataset(1)
    with pytest.raises(TaskValidationError, match="allowed_env_models"):
        generate_rollouts(tasks, scripted(bisect_solver, tokenizer), 1, cache_dir=tmp_path, progress=False)


def test_server_failures_are_episode_errors(tokenizer):
    server, thread, url = _serve(Serial, 1)  # no concurrent sessions: the second one is refused
    try:
        env = OpenEnvEnv(tokenizer, {"base_url": url, "max_turns": 2})
        out = env.run_trial([{"seed": 1}], ScriptedAgent(["1", "2"]), num_rollouts=3)
        errors = [e for e in out["errors"] if e]
        assert "error" in out["statuses"] and all("reset failed" in e and "SUPPORTS_CONCURRENT_SESSIONS" in e
                                                  for e in errors)  # fmt: skip
        assert all(math.isnan(r) for r, s in zip(out["final_rewards"], out["statuses"]) if s == "error")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    down = OpenEnvEnv(tokenizer, {"base_url": url, "connect_timeout": 2.0})  # the server is gone now
    ep = down._run_complete_episode("s", ScriptedAgent(["1"]), {"seed": 1})
    assert ep["status"] == "error" and "reset failed" in ep["error"] and math.isnan(ep["final_reward"])


def test_cli_allows_the_url_it_was_given(server_url, tmp_path):
    from hf_rollouts.cli import main

    args = ["generate", "--env", f"openenv:{server_url}", "--num-tasks", "2", "--num-rollouts", "2",
            "--max-new-tokens", "4", "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]  # fmt: skip
    assert main(args) == 0
