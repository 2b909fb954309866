"""All live episodes share each generation call; results equal the one-by-one run."""

from __future__ import annotations

from datasets import concatenate_datasets

from hf_rollouts import ScriptedAgent
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts

TASKS = [{"code": [1, 2, 3, 4]}, {"code": [2, 2, 1, 1]}, {"code": [6, 5, 4, 3]}]


def test_n_episodes_of_t_turns_take_at_most_t_generation_calls(tokenizer, hf_agent, recording):
    env = MastermindEnv(tokenizer, {"max_turns": 3})
    agent = recording(hf_agent)
    out = env.run_trial(TASKS, agent, num_rollouts=4)
    assert len(out["statuses"]) == 12
    assert len(agent.batch_sizes) <= 3  # not 12 x 3
    assert agent.batch_sizes[0] == 12
    assert hf_agent.generate_calls == len(agent.batch_sizes)


def test_max_concurrency_bounds_each_batch(tokenizer, hf_agent, recording):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    agent = recording(hf_agent)
    env.run_trial(TASKS, agent, num_rollouts=3, max_concurrency=4)
    assert max(agent.batch_sizes) == 4 and sum(agent.batch_sizes) == 9 * 2


def _strip(out):
    return {k: v for k, v in out.items() if k != "conversations"}, out["conversations"]


def test_concurrent_results_equal_the_sequential_run(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 4})

    def script(messages):  # depends on the conversation, so any mix-up between episodes shows
        last = messages[-1]["content"]
        return "2 2 1 1" if " black, " in last else "1 2 3 4"

    concurrent = env.run_trial(TASKS, ScriptedAgent(script), num_rollouts=3)
    sequential = env.run_trial(TASKS, ScriptedAgent(script), num_rollouts=3, max_concurrency=1)
    assert concurrent == sequential
    assert concurrent["statuses"].count("done") == 6  # task 0 at turn 1, task 1 at turn 2


def test_one_generation_call_serves_every_env_group_of_a_batch(tokenizer, hf_agent, recording, tmp_path):
    a = MastermindEnv(tokenizer, {"max_turns": 3}).get_train_dataset(2)
    b = GuessNumberEnv(tokenizer, {"max_turns": 2}).get_train_dataset(2)
    agent = recording(hf_agent)
    generate_rollouts(concatenate_datasets([a, b]), agent, 2, batch_size=4, cache_dir=tmp_path, progress=False)
    assert agent.batch_sizes[0] == 8 and len(agent.batch_sizes) <= 3


def test_tokenization_work_is_linear_in_episode_length(tokenizer, monkeypatch):
    env = MastermindEnv(tokenizer, {"max_turns": 12})
    encoded: list[int] = []
    real = env.chat.encode
    monkeypatch.setattr(env.chat, "encode", lambda text: encoded.append(len(text)) or real(text))
    ep = env._run_complete_episode("s", ScriptedAgent(["1 1 1 1"]), {"code": [6, 6, 6, 6]})
    assert ep["num_turns"] == 12
    first_prompt, *rest = encoded
    # after the first prompt, every encode is one message-sized delta: no call grows with the history
    assert max(rest) < 120 and len(rest) <= 2 * 12  # 12 agent texts, 11 deltas, one cached closing
    assert sum(rest) < 12 * 120


def test_one_failed_request_fails_only_its_own_episode(tokenizer, recording):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    agent = ScriptedAgent(["1 1 1 1"], fail_at={1})
    watch = recording(agent)
    out = env.run_trial(TASKS, watch, num_rollouts=2)
    assert watch.batch_sizes[0] == 6  # the failure happened inside a shared batch
    assert out["statuses"].count("error") == 1 and out["statuses"][1] == "error"
    assert all(s == "truncated" for i, s in enumerate(out["statuses"]) if i != 1)


def test_on_error_raise_stops_starting_new_episodes(tokenizer):
    import pytest

    env = MastermindEnv(tokenizer, {"max_turns": 2})
    agent = ScriptedAgent(["1 1 1 1"], fail_at={0})
    with pytest.raises(RuntimeError, match="scripted failure"):
        env.run_trial(TASKS * 2, agent, num_rollouts=2, max_concurrency=2, on_error="raise")
    assert agent.calls < 6  # 12 episodes x 2 turns would be 24 calls


def test_kv_cache_is_released_when_the_episodes_end(tokenizer, hf_agent):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    env.run_trial(TASKS, hf_agent, num_rollouts=2)
    assert hf_agent.kv_reused_calls == 1 and hf_agent._kv is None
