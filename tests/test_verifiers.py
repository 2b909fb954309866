"""verifiers adapter (classic API, verifiers 0.3.x) with a small env package (tests/hfr_vf_arith.py).

These run where verifiers imports. The main test venv has none (verifiers 0.3 pins mcp<2, the test extra has
mcp>=2.3): there tests/test_verifiers_venv.py runs this file in the venv of ``scripts/setup_verifiers.sh``.
"""

from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip(
    "verifiers.legacy",
    reason="verifiers is not installed here (it pins mcp<2); tests/test_verifiers_venv.py runs this file in its venv",
)

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.agents.base import Agent  # noqa: E402
from hf_rollouts.envs.check import check_env  # noqa: E402
from hf_rollouts.envs.verifiers import VerifiersEnv  # noqa: E402
from hf_rollouts.pipeline import generate_rollouts  # noqa: E402
from hf_rollouts.schema import TaskValidationError  # noqa: E402
from hf_rollouts.types import Action  # noqa: E402

ALLOW = ["hfr_vf_arith"]


def adder(messages):
    a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
    return f"The sum is {a + b}"


def bisect_solver(messages):
    low, high = 1, 15
    for guess, hint in zip(messages[1::2], messages[2::2]):
        g = int(guess["content"])
        low, high = (g + 1, high) if hint["content"].startswith("Higher") else (low, g - 1)
    return str((low + high) // 2)


def scripted(fn, tokenizer):
    agent = ScriptedAgent(fn)
    agent.tokenizer = tokenizer
    return agent


def flat(out, column):
    return [x for row in out[column] for x in row]


def test_single_turn_scripted_solver_and_tiny_model(tokenizer, tiny, tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent

    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"})
    tasks = env.get_train_dataset(4)
    assert (
        json.loads(tasks[0]["task_data"])["answer"] and json.loads(tasks[0]["task_data"])["prompt"][0]["role"] == "user"
    )
    out = generate_rollouts(tasks, scripted(adder, tokenizer), 2, cache_dir=tmp_path / "a", progress=False,
                            allowed_env_modules=ALLOW)  # fmt: skip
    assert flat(out, "statuses") == ["done"] * 8 and flat(out, "final_rewards") == [1.0] * 8
    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=8, seed=0)
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path / "b", progress=False, allowed_env_modules=ALLOW)
    assert set(flat(out, "statuses")) <= {"done", "truncated"} and set(flat(out, "final_rewards")) <= {0.0, 1.0}


def test_multi_turn_env_response_and_its_own_turn_limit(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "multi"}})
    assert env.max_turns == 5  # the env's own
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    won = env._run_complete_episode("s", ScriptedAgent(bisect_solver), task)
    assert won["status"] == "done" and won["final_reward"] == 1.0 and won["num_turns"] <= 4
    assert {m["content"] for m in won["messages"][2::2]} <= {"Higher.", "Lower."}
    lost = env._run_complete_episode("s", ScriptedAgent(["0"]), task)
    assert lost["status"] == "truncated" and lost["num_turns"] == 5 and lost["final_reward"] == 0.0
    assert lost["turns"][-1].info["stop_condition"] == "max_turns_reached"


def test_group_rubric_scores_the_whole_group(tokenizer, tmp_path):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "group"}})
    assert env.group_scored
    tasks = env.get_train_dataset(2)

    answers = iter(["{}", "Well, the sum is {}", "wrong"] * 2)

    def solver(messages):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return next(answers).format(a + b)

    out = env.run_trial(list(tasks["task_data"]), scripted(solver, tokenizer), num_rollouts=3, max_concurrency=1)
    assert out["statuses"] == ["done"] * 6
    assert out["final_rewards"] == [1.5, 1.0, 0.0, 1.5, 1.0, 0.0]  # exact + the group's shortest-correct bonus
    for k in range(6):
        assert sum(out["padded_per_token_rewards"][k]) == pytest.approx(out["final_rewards"][k])


def test_reward_function_errors_are_episode_errors(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "broken"}})
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    ep = env._run_complete_episode("s", ScriptedAgent(adder), task)
    assert ep["status"] == "error" and "reward function 'broken' raised KeyError" in ep["error"]
    assert math.isnan(ep["final_reward"])


def test_check_env_and_trust(tokenizer, tmp_path):
    assert check_env(VerifiersEnv, tokenizer, env_config={"env_id": "hfr-vf-arith"}, actions=["42"]).steps > 0
    tasks = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"}).get_train_dataset(1)
    with pytest.raises(TaskValidationError, match="names code to import: module 'hfr_vf_arith'"):
        generate_rollouts(tasks, scripted(adder, tokenizer), 1, cache_dir=tmp_path, progress=False)
    fp = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"}).fingerprint()
    assert fp["verifiers"].startswith("0.3") and fp["env_module"] == "hfr_vf_arith"


class AddAgent(Agent):
    """Calls the env's add tool with the question's numbers (Hermes format, ended on the end token), then answers
    the tool's result; with ``use_tool=False`` it answers the plain sum."""

    def __init__(self, tok, use_tool=True, args=None):
        self.tok = self.tokenizer = tok
        self.use_tool, self.args = use_tool, args
        self.seen = []  # (prompt ids, sampled ids) of every turn

    def get_action(self, messages, agent_state=None):
        raise NotImplementedError

    def act(self, request):
        question = next(m["content"] for m in request.messages if m["role"] == "user")
        a, b = map(int, re.findall(r"\d+", question)[:2])
        if self.use_tool and request.agent_state is None:
            args = self.args or {"a": a, "b": b}
            text = f'<tool_call>\n{{"name": "add", "arguments": {json.dumps(args)}}}\n</tool_call>'
            state = "called"
        else:
            last = request.messages[-1]
            text = f"The sum is {last['content'] if last['role'] == 'tool' else a + b}"
            state = "answered"
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        self.seen.append((list(request.prompt_token_ids), ids))
        return Action(text, ids, None, True), state


def test_tool_env_calls_run_by_verifiers_token_exact(tokenizer, tmp_path):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "tools"}})
    assert env.toolbox is not None and list(env.toolbox.tools) == ["add"]
    tasks = env.get_train_dataset(4)
    out = generate_rollouts(tasks, AddAgent(tokenizer), 2, cache_dir=tmp_path / "a", progress=False,
                            allowed_env_modules=ALLOW)  # fmt: skip
    assert flat(out, "statuses") == ["done"] * 8 and flat(out, "final_rewards") == [1.0] * 8
    assert flat(out, "num_tool_calls") == [1] * 8 and flat(out, "num_tool_errors") == [0] * 8
    columns = ("padded_tool_token_mask", "padded_agent_token_mask", "padded_per_token_rewards")
    for tool_mask, agent_mask, rewards in zip(*(flat(out, c) for c in columns)):
        assert any(m for m in tool_mask) and not any(t and a for t, a in zip(tool_mask, agent_mask))
        assert all(r == 0 or a for r, a in zip(rewards, agent_mask))  # rewards only on agent tokens
    tool_text = tokenizer.decode(
        [t for t, m in zip(flat(out, "padded_full_token_ids")[0], flat(out, "padded_tool_token_mask")[0]) if m]
    )
    assert (
        str(int(json.loads(tasks[0]["task_data"])["answer"])) in tool_text
    )  # verifiers' add ran: the tool turn holds its answer
    without = generate_rollouts(tasks, AddAgent(tokenizer, use_tool=False), 1, cache_dir=tmp_path / "b",
                                progress=False, allowed_env_modules=ALLOW)  # fmt: skip
    assert flat(without, "final_rewards") == [0.0] * 4 and flat(without, "num_tool_calls") == [0] * 4


def test_tool_env_tool_errors_reach_the_model(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "tools"}})
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    out = env.run_trial([task], AddAgent(tokenizer, args={"a": -1, "b": 2}), num_rollouts=1)
    assert out["statuses"] == ["done"] and out["final_rewards"] == [0.0] and out["num_tool_calls"] == [1]
    ids, mask = out["padded_full_token_ids"][0], out["padded_tool_token_mask"][0]
    assert "add takes numbers >= 0" in tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_tool_env_each_turn_saw_a_prefix_of_the_stored_sequence(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "tools"}})
    agent = AddAgent(tokenizer)
    out = env.run_trial([json.loads(env.get_train_dataset(1)[0]["task_data"])], agent, num_rollouts=1)
    full = [t for t, m in zip(out["padded_full_token_ids"][0], out["padded_full_attention_mask"][0]) if m]
    assert len(agent.seen) == 2
    for prompt, sampled in agent.seen:  # the model saw a prefix, and its sampled ids follow it as sampled
        assert full[: len(prompt)] == prompt and full[len(prompt) : len(prompt) + len(sampled)] == sampled
    assert full[-len(agent.seen[-1][1]) :] == agent.seen[-1][1]


def test_mcp_tools_name_the_old_mcp_that_verifiers_pins():
    from hf_rollouts.tools.mcp import MCPTools

    with pytest.raises(ImportError, match=r"need mcp>=2\.3: mcp 1\.\d+\.\d+ is installed, which has no mcp\.Client"):
        MCPTools("stdio:python -c pass")


def test_an_episode_we_end_first_is_cleaned_up_and_scored(tokenizer):
    """Our max_turns (2) below the env's (5): verifiers never completes the episode; it is stored truncated,
    cleaned up and scored by the rubric, the score on its last agent turn."""
    env_args = {"kind": "multi", "took_part_weight": 0.25}
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": env_args, "max_turns": 2})
    tasks = [t["task_data"] for t in env.get_train_dataset(2)]
    out = env.run_trial(tasks, scripted(lambda m: "0", tokenizer), num_rollouts=2)
    assert out["statuses"] == ["truncated"] * 4 and out["final_rewards"] == [0.25] * 4
    for k in range(4):
        rewards, mask = out["padded_per_token_rewards"][k], out["padded_agent_token_mask"][k]
        assert sum(rewards) == pytest.approx(0.25) and all(m or not r for r, m in zip(rewards, mask))
    one = env._run_complete_episode("s", ScriptedAgent(["0"]), tasks[0])  # a group of one: scored the same
    assert one["status"] == "truncated" and one["final_reward"] == 0.25 and "env_state" not in one


def test_a_group_rubric_scores_members_we_ended_first(tokenizer):
    env_args = {"kind": "multi", "took_part_weight": 0.25, "group": True}
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": env_args, "max_turns": 2})
    assert env.group_scored
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    target = int(task["answer"])
    answers = iter([str(target), "0", "0"])  # rollout 0 wins on its first turn, the others are cut after two
    out = env.run_trial([task], scripted(lambda m: next(answers, "0"), tokenizer), num_rollouts=3, max_concurrency=1)
    assert out["statuses"] == ["done", "truncated", "truncated"]
    assert out["final_rewards"] == [1.75, 0.25, 0.25]  # exact + took part + the group's shortest-correct bonus


def test_every_ending_runs_verifiers_cleanup_once(tokenizer):
    """As verifiers' own rollout does in ``finally``: cleanup once per episode, a failing env_response included."""
    import hfr_vf_arith

    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "multi"}, "max_turns": 3})
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    hfr_vf_arith.CLEANED.clear()
    played = env._run_complete_episode("a", ScriptedAgent(bisect_solver), task)
    broke = env._run_complete_episode("b", ScriptedAgent(["99"]), task)
    assert played["status"] in ("done", "truncated")
    assert broke["status"] == "error" and "env_response broke" in broke["error"]
    assert hfr_vf_arith.CLEANED == [task["answer"]] * 2


def test_a_row_without_a_prompt_is_refused_before_any_episode(tokenizer, tmp_path):
    from hf_rollouts.schema import to_task_dataset

    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"})
    good = env.get_train_dataset(1)[0]
    rows = [good, {**good, "task_data": {"answer": "3"}}]
    with pytest.raises(TaskValidationError, match="row 1, field 'task_data', key 'prompt'"):
        generate_rollouts(to_task_dataset(rows), scripted(adder, tokenizer), 1, cache_dir=tmp_path, progress=False,
                          allowed_env_modules=ALLOW)  # fmt: skip
