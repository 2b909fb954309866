"""Held-out evaluation: the Wilson interval and success counted from real rollouts."""

from __future__ import annotations

import json
import math

import pytest

from hf_rollouts import ScriptedAgent
from hf_rollouts.envs.arithmetic import ArithmeticEnv
from hf_rollouts.evaluation import evaluate_agent, wilson_interval


@pytest.mark.parametrize(
    "k, n, low, high",
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (1, 100, 0.0018, 0.0545)],
)
def test_wilson_interval_matches_published_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


class AnswersSeven(ScriptedAgent):
    """Says 7 on every turn: right exactly on the held-out questions whose answer is 7."""

    def __init__(self):
        super().__init__(["7"])


def test_evaluate_agent_counts_wins_over_every_episode(tokenizer, tmp_path):
    env = ArithmeticEnv(tokenizer, {})
    tasks = env.get_eval_dataset(40)
    sevens = sum(1 for t in map(json.loads, tasks["task_data"]) if t["a"] + t["b"] == 7)
    assert 0 < sevens < 40
    result = evaluate_agent(tasks, AnswersSeven(), 2, seed=0, cache_dir=tmp_path, tokenizer=tokenizer)
    assert result.episodes == 80 and result.errors == 0 and result.successes == 2 * sevens
    assert result.success == pytest.approx(2 * sevens / 80) and result.low <= result.success <= result.high
    assert result.tool_rate == 0 and "success" in result.describe()


def test_evaluate_agent_greedy_decodes_greedily_for_the_evaluation_only(tiny, tmp_path):
    """Issue 46, item 5: ``greedy=True`` evaluates the agent's most likely answers (its sampling at temperature 0, as
    a second greedy agent on the same model would) and leaves the agent sampling as before."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.envs.guess_number import GuessNumberEnv

    class Seen(TransformersAgent):
        def act_batch(self, requests):
            self.temperatures.add(self.sampling.temperature)
            return super().act_batch(requests)

    model, tok = tiny
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 9, "max_turns": 2}).get_eval_dataset(6)
    agent = Seen(model, tok, temperature=1.0, max_new_tokens=4, seed=0)
    agent.temperatures = set()
    greedy = [evaluate_agent(tasks, agent, 2, seed=s, greedy=True, cache_dir=tmp_path / str(s)) for s in (0, 1)]
    assert agent.temperatures == {0.0} and agent.sampling.temperature == 1.0  # greedy inside, as it was after
    reference = evaluate_agent(tasks, TransformersAgent(model, tok, temperature=0.0, max_new_tokens=4), 2, seed=5)
    for result in greedy:  # the seed does not matter and a greedy second agent agrees
        assert (result.successes, result.mean_reward) == (reference.successes, reference.mean_reward)
    with pytest.raises(ValueError, match="no SamplingConfig"):
        evaluate_agent(tasks, AnswersSeven(), seed=0, greedy=True, tokenizer=tok)
