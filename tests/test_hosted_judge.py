"""A hosted judge (issue 50): ``openai:URL#MODEL`` of a chat-only API with no Hugging Face tokenizer. A judge reads
text (no token ids of it are stored), so it loads no tokenizer and talks chat mode; a policy from such a spec still
needs one, and the error says how to give it. Checked against a loopback chat server that has no ``/tokenize`` and
no ``/v1/completions`` (``tests/chat_only_server.py``), driving dataset-env episodes scored by it."""

from __future__ import annotations

import json

import pytest
from chat_only_server import ChatOnlyServer
from datasets import Dataset

from hf_rollouts import ScriptedAgent, generate_rollouts
from hf_rollouts.agents.loading import ModelNotFoundError, load_agent
from hf_rollouts.envs.dataset import to_task_rows
from hf_rollouts.verify import Judge


def hosted_judge(messages):
    """What the hosted model says: yes when the student's answer is the reference (the default template)."""
    text = messages[-1]["content"]
    if "Reference answer:" not in text:  # the agent's one-token probe ("Hi")
        return "Hello"
    reference = text.split("Reference answer:\n")[1].split("\n")[0]
    student = text.split("Student's answer:\n")[1].split("\n")[0]
    return "Yes." if student.strip() == reference else "No, the student's answer differs from the reference."


def test_a_hosted_chat_judge_needs_no_tokenizer_and_scores_dataset_episodes(tokenizer, tmp_path):
    questions = Dataset.from_list([{"q": "What is 2 + 2?", "a": "4"}, {"q": "What is 3 + 3?", "a": "6"}])
    with ChatOnlyServer(hosted_judge) as server:
        spec = f"openai:{server.url}#judge-1"
        tasks = to_task_rows(
            questions, prompt_column="q", answer_column="a", env_config={"verifier": {"name": "judge", "model": spec}}
        )
        policy = ScriptedAgent(lambda m: "4" if "2 + 2" in m[-1]["content"] else "7")
        out = generate_rollouts(
            tasks,
            policy,
            num_rollouts=2,
            seed=0,
            tokenizer=tokenizer,
            progress=False,
            cache_dir=str(tmp_path),
            allowed_env_models=[spec],
        )
        judge = Judge(spec)
        agent = judge.agent()
    assert out["statuses"] == [["done", "done"], ["done", "done"]]
    assert out["final_rewards"] == [[1.0, 1.0], [0.0, 0.0]] and out["solved"] == [[True, True], [False, False]]
    component = json.loads(out["infos"][1][0])["components"][0]
    assert component["info"]["judge_reply"].startswith("No, the student's") and component["info"]["verdict"] == "No"
    assert agent.tokenizer is None and agent.capabilities.mode == "chat"
    assert "return_token_ids" in agent.capabilities.dropped  # the hosted API refused it by name; dropped for good
    assert server.paths() == {"/v1/chat/completions"}  # never /v1/completions, never /tokenize
    asked = [body for _, _, body in server.log if body and "messages" in body and body.get("max_tokens") == 16]
    assert len(asked) >= 4 and all("Student's answer" in b["messages"][-1]["content"] for b in asked)


def test_a_policy_from_a_hosted_spec_needs_a_tokenizer_and_is_told_how_to_give_one(tokenizer, _cache_dir):
    from hf_rollouts.tiny_model import tiny_model_path

    with ChatOnlyServer(hosted_judge) as server:
        spec = f"openai:{server.url}#judge-1"
        with pytest.raises(ModelNotFoundError, match="needs the served model's tokenizer.*CLI: --tokenizer"):
            load_agent(spec)
        policy = load_agent(spec, tokenizer=str(tiny_model_path(0)))  # a tokenizer given: a policy it can be
        assert policy.tokenizer is not None
        judge_agent = load_agent(spec, needs_tokenizer=False)
        assert judge_agent.tokenizer is None and judge_agent.recipe.kwargs["needs_tokenizer"] is False
    assert server.log == []  # loading probes nothing


def test_the_cli_refuses_a_hosted_policy_without_a_tokenizer_in_one_line(tmp_path, capsys):
    from hf_rollouts.cli import main

    with ChatOnlyServer(hosted_judge) as server:
        argv = ["generate", "--env", "mastermind", "--num-tasks", "1", "--model", f"openai:{server.url}#judge-1"]
        assert main([*argv, "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: openai:") and "(CLI: --tokenizer)" in err and len(err.strip().splitlines()) == 1
