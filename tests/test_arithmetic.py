"""The arithmetic and calculator envs: contract, held-out split by fact, last-integer scoring, the calculator tool."""

from __future__ import annotations

import re

import pytest

from hf_rollouts import ScriptedAgent
from hf_rollouts.agents.base import Agent
from hf_rollouts.envs.arithmetic import ArithmeticEnv, CalculatorEnv, calculator, last_integer
from hf_rollouts.envs.check import check_env
from hf_rollouts.envs.config import EnvConfigError
from hf_rollouts.types import Action


def test_both_envs_pass_check_env(tokenizer):
    assert check_env(ArithmeticEnv, tokenizer).episodes > 0
    assert check_env(CalculatorEnv, tokenizer, env_config={"max_turns": 3}).episodes > 0


def test_splits_are_disjoint_by_fact_and_the_default_eval_split_has_at_least_128_tasks(tokenizer):
    env = ArithmeticEnv(tokenizer, {})
    train, held_out = env._task_list("train", None), env._task_list("eval", None)
    fact = lambda t: (t["a"], t["op"], t["b"])  # noqa: E731
    assert {fact(t) for t in train}.isdisjoint(fact(t) for t in held_out)
    assert len(held_out) >= 128 and len(train) + len(held_out) == 81 * 4  # 1..9 + 1..9, four phrasings
    assert {t["phrasing"] for t in held_out} == {0, 1, 2, 3}
    minus = ArithmeticEnv(tokenizer, {"operators": "-"})._task_list("train", None)
    assert minus and all(t["a"] >= t["b"] for t in minus)  # no negative differences


@pytest.mark.parametrize(
    "reply, reward",
    [
        ("7", 1.0),
        ("3 + 4 = 7", 1.0),
        ("The answer is 7.", 1.0),
        ("7 + 0 = 7\n\nThis is", 1.0),
        ("7 is the sum of 3 and 4", 0.0),  # the last integer is 4
        ("To add 3 and 4, you simply", 0.0),  # cut before the answer
        ("seven", 0.0),
        ("", 0.0),
    ],
)
def test_the_last_integer_of_the_reply_is_scored(tokenizer, reply, reward):
    env = ArithmeticEnv(tokenizer, {})
    ep = env._run_complete_episode("s", ScriptedAgent([reply]), {"a": 3, "op": "+", "b": 4, "phrasing": 0})
    assert ep["status"] == "done" and ep["final_reward"] == reward and ep["num_turns"] == 1
    assert ep["messages"][-2]["content"] == "What is 3 + 4?"


def test_last_integer_reads_signs_and_thousands_separators():
    assert last_integer("9 - 12 = -3") == -3 and last_integer("1,458") == 1458 and last_integer("none") is None


@pytest.mark.parametrize(
    "config, key",
    [
        ({"operators": "/"}, "operators"),
        ({"operators": ""}, "operators"),
        ({"min_operand": 5, "max_operand": 4}, "max_operand"),
        ({"phrasings": ["What is {a}?"]}, "phrasings"),
        ({"phrasings": ['{a} {op} {b}, e.g. {"x": 1}']}, "phrasings"),  # literal braces must be doubled
    ],
)
def test_bad_configs_name_the_key(tokenizer, config, key):
    with pytest.raises(EnvConfigError) as info:
        ArithmeticEnv(tokenizer, config)
    assert info.value.key == key


def test_calculator_tool_evaluates_two_integers_and_refuses_anything_else():
    assert calculator("964 + 494") == 1458 and calculator(" 12*3 ") == 36 and calculator("5 - 9") == -4
    with pytest.raises(ValueError, match="two integers"):
        calculator("__import__('os')")


class CalculatorAgent(Agent):
    """Calls the calculator with the question's expression (or ``expression``), then answers what it returned."""

    def __init__(self, tok, expression: str | None = None, use_tool: bool = True):
        self.tok, self.expression, self.use_tool = tok, expression, use_tool

    def get_action(self, messages, agent_state=None):
        raise NotImplementedError

    def act(self, request):
        if self.use_tool and request.agent_state is None:
            question = request.messages[-1]["content"]
            expr = self.expression or re.search(r"\d+ [-+*] \d+", question).group()
            text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}\n</tool_call>'
        else:
            last = request.messages[-1]
            text = f"The answer is {last['content']}." if last["role"] == "tool" else "The answer is 1000."
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return Action(text, ids, None, True), "called"


def test_calculator_env_is_won_through_its_tool(tokenizer):
    env = CalculatorEnv(tokenizer, {})
    tasks = [{"a": 964, "op": "+", "b": 494, "phrasing": 0}, {"a": 100, "op": "+", "b": 250, "phrasing": 0}]
    won = env.run_trial(tasks, CalculatorAgent(tokenizer), num_rollouts=1)
    assert won["final_rewards"] == [1.0, 1.0] and won["num_tool_calls"] == [1, 1] and won["num_tool_errors"] == [0, 0]
    assert all(sum(m) > 0 for m in won["padded_tool_token_mask"])
    for tool, agent in zip(won["padded_tool_token_mask"], won["padded_agent_token_mask"]):
        assert not any(t and a for t, a in zip(tool, agent))  # tool output is never an agent token
    guessed = env.run_trial(tasks, CalculatorAgent(tokenizer, use_tool=False), num_rollouts=1)
    assert guessed["final_rewards"] == [0.0, 0.0] and guessed["statuses"] == ["done", "done"]
    bad = env.run_trial(tasks[:1], CalculatorAgent(tokenizer, expression="nine plus four"), num_rollouts=1)
    assert bad["num_tool_errors"] == [1] and bad["final_rewards"] == [0.0] and bad["statuses"] == ["done"]
