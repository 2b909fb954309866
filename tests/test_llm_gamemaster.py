"""AgentGamemaster: a Twenty Questions gamemaster backed by any Agent (here scripted)."""

from __future__ import annotations

import math
import threading

import pytest

from hf_rollouts import ScriptedAgent
from hf_rollouts.agents.base import Agent
from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
from hf_rollouts.envs.twenty_questions.knowledge import NO, UNKNOWN, YES, Gamemaster
from hf_rollouts.envs.twenty_questions.llm_gamemaster import (
    DEFAULT_SYSTEM_PROMPT,
    AgentGamemaster,
    gamemaster_from_config,
    parse_answer,
)
from hf_rollouts.types import Action


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Yes", YES),
        ("yes.", YES),
        (" NO! ", NO),
        ('"No"', NO),
        ("I don't know", UNKNOWN),
        ("i dont know.", UNKNOWN),
        ("I do not know", UNKNOWN),
        ("I don\u2019t know", UNKNOWN),
        ("**Yes**", YES),
        ("Yes, it is alive.", None),
        ("Maybe", None),
        ("", None),
        ("yes no", None),
        ("Yes\nNo", None),
    ],
)
def test_parse_answer_is_strict(reply, expected):
    assert parse_answer(reply) == expected


def test_answers_from_the_agent_and_counts_unparseable():
    seen = []

    def oracle(messages):
        seen.append(messages)
        q = messages[-1]["content"].lower()
        return "Yes." if "alive" in q else "no" if "metal" in q else "Well, it depends on the clock."

    gm = AgentGamemaster(ScriptedAgent(oracle))
    assert isinstance(gm, Gamemaster)  # implements the protocol
    assert gm.answer("Is it alive?", "dog") == YES
    assert gm.answer("Is it made of metal?", "dog") == NO
    assert gm.answer("Is it big?", "dog") == UNKNOWN
    assert gm.calls == 3 and gm.unparseable == 1
    assert list(gm.unparseable_examples) == [("Is it big?", "Well, it depends on the clock.")]
    system, user = seen[0]
    assert system["role"] == "system" and "dog" in system["content"] and "Yes | No | I don't know" in system["content"]
    assert user == {"role": "user", "content": "Is it alive?"}
    with pytest.raises(ValueError, match="solution"):
        AgentGamemaster(ScriptedAgent(["Yes"]), system_prompt="no placeholder")


def test_action_replies_and_agent_errors_propagate():
    class ActionAgent(Agent):
        def get_action(self, messages, agent_state=None):
            return Action(text="No", token_ids=[1], logprobs=[-0.1]), agent_state

    assert AgentGamemaster(ActionAgent()).answer("Is it alive?", "rock") == NO
    gm = AgentGamemaster(ScriptedAgent(["Yes"], fail_at=[0]))
    with pytest.raises(RuntimeError, match="scripted failure"):
        gm.answer("Is it alive?", "dog")


def test_in_an_episode_with_concurrent_rollouts(tokenizer):
    def gm_script(messages):
        solution = messages[0]["content"].split("The secret object is: ")[1].split(".")[0]
        q = messages[-1]["content"].lower()
        return "Yes" if solution in ("dog", "cat") and "animal" in q else "No" if "animal" in q else "perhaps?"

    gm = AgentGamemaster(ScriptedAgent(gm_script))
    env = TwentyQuestionsEnv(tokenizer, {"max_turns": 4}, gamemaster=gm)
    player = ScriptedAgent(["Is it an animal?", "Is it heavy?", "Is it a dog?"])
    out = env.run_trial([{"solution": "dog"}, {"solution": "clock"}], player, num_rollouts=3)
    assert out["statuses"] == ["done"] * 3 + ["truncated"] * 3
    assert out["final_rewards"][:3] == [1.0] * 3 and out["final_rewards"][3:] == [0.0] * 3
    dog, clock = out["conversations"][0], out["conversations"][3]
    assert dog[2]["content"] == YES and clock[2]["content"] == NO
    assert dog[4]["content"] == UNKNOWN  # "perhaps?" is not an answer
    assert gm.calls == 12 and gm.unparseable == 6  # 6 episodes x 2 questions; guesses never reach the gamemaster


def test_agents_that_are_not_thread_safe_are_called_one_at_a_time():
    active, peak, lock = [0], [0], threading.Lock()

    def slow(messages):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        threading.Event().wait(0.02)
        with lock:
            active[0] -= 1
        return "Yes"

    gm = AgentGamemaster(ScriptedAgent(slow))
    threads = [threading.Thread(target=gm.answer, args=(f"q{i}", "dog")) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert peak[0] == 1 and gm.calls == 6


def test_agent_failure_makes_the_episode_an_error(tokenizer):
    gm = AgentGamemaster(ScriptedAgent(["Yes"], fail_at=[1]))
    env = TwentyQuestionsEnv(tokenizer, {"max_turns": 3}, gamemaster=gm)
    ep = env._run_complete_episode("s", ScriptedAgent(["Is it alive?"]), {"solution": "dog"})
    assert ep["status"] == "error" and "scripted failure" in ep["error"] and math.isnan(ep["final_reward"])


def test_gamemaster_from_config(tokenizer):
    with pytest.raises(ValueError, match="gamemaster_model"):
        gamemaster_from_config({"gamemaster": "agent"})
    gm = gamemaster_from_config({"gamemaster_model": "openai:http://127.0.0.1:9/v1#judge", "gamemaster_max_tokens": 4})
    s, sampling = gm.agent.settings, gm.agent.sampling
    assert (s.model, s.mode, sampling.temperature, sampling.max_new_tokens) == ("judge", "chat", 0.0, 4)
    assert gm.agent.negotiate().source == "settings"  # text answers only: no probe of a task-named host
    assert gm.system_prompt == DEFAULT_SYSTEM_PROMPT and gm._agent_lock is None  # HTTP agent: concurrent questions
    local = gamemaster_from_config({"gamemaster_model": "tiny"})
    assert local.agent.sampling.temperature == 0.0 and local._agent_lock is not None
    assert local.answer("Is it alive?", "dog") in (YES, NO, UNKNOWN)  # a real (random-weight) model answers
