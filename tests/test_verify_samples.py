"""``verify`` on episodes of several samples: a render-mode dataset (the Qwen3 template, thinking on, which drops
the reasoning of earlier turns, so each turn after the first starts a new sample) verifies by playing its stored
agent tokens back (``rewards_only``) and by a full replay with the tiny model; a changed token of an EARLIER sample
(the ``earlier_*`` columns) is found and named."""

from __future__ import annotations

import pytest
from datasets import Dataset, load_from_disk
from test_chat_templates import (  # noqa: F401 (frozen_date: autouse)
    END_TOKEN,
    biased_to_stop_and_reason,
    family_tokenizer,
    frozen_date,
)
from test_verify_rollouts import edit_cell, report_of, tampered

from hf_rollouts import generate_rollouts
from hf_rollouts.agents.base import Agent
from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.dataset import to_task_rows
from hf_rollouts.publish import render_card, save_rollouts
from hf_rollouts.types import Action, AgentRequest

ROWS = 3
CONFIG = {
    "verifier": {"name": "numeric"},
    "extraction": "last_number",
    "max_turns": 3,
    "template_mode": "render",
    "chat_template_kwargs": {"enable_thinking": True},
}
REASONING = "<think>\nmaybe {n}\n</think>\n\n"


class ReasoningAgent(Agent):
    """Answers turn t with reasoning and "It is t." as token ids (row 0's answer, 1, is right at turn 1)."""

    def __init__(self, tok) -> None:
        self.tok, self.stop = tok, tok.convert_tokens_to_ids(END_TOKEN["qwen3"])

    def get_action(self, messages, agent_state=None):
        raise NotImplementedError("token-level only")

    def act(self, request: AgentRequest):
        turn = request.agent_state or 0
        text = REASONING.format(n=turn) + f"It is {turn}."
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.stop]
        return Action(text=text, token_ids=ids, stopped=True), turn + 1


def tasks():
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(ROWS)]
    return to_task_rows(Dataset.from_list(rows), env_config=CONFIG)


def save(ds, tok, out):
    return save_rollouts(ds, out, render_card(ds, agent_info={"model": "m"}, seed=0, pad_token_id=tok.pad_token_id))


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    return family_tokenizer(tokenizer, "qwen3")


@pytest.fixture(scope="module")
def scripted(qwen3, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("samples")
    ds = generate_rollouts(tasks(), ReasoningAgent(qwen3), 2, tokenizer=qwen3, cache_dir=tmp / "c", progress=False)
    return save(ds, qwen3, tmp / "out")


def test_a_branched_dataset_verifies_by_playing_back_its_stored_tokens(scripted, qwen3):
    ds = load_from_disk(str(scripted))
    assert ds[0]["num_samples"] == [2, 2] and ds[0]["sample_calls"] == [[1, 1], [1, 1]]
    assert ds[1]["solved"] == [True, True] and ds[2]["num_samples"] == [3, 3] and ds[2]["solved"] == [False, False]
    report = report_of(scripted, None, tokenizer=qwen3, sample=ROWS, rewards_only=True)
    assert report.exit_code == 0 and not report.mismatches, report.text()


def test_a_changed_env_token_of_an_earlier_sample_is_named(scripted, qwen3, tmp_path):
    """An env token of row 1's first sample changed: the row hash names the column, and the replay finds the first
    call's prompt leaving sample 0 at that position."""
    at = 3

    def change(samples):
        first = [list(s) for s in samples[0]]
        first[0][at] = first[0][at] + 1
        return [first, *samples[1:]]

    bad = tampered(scripted, tmp_path, edit_cell("earlier_token_ids", 1, change))
    report = report_of(bad, None, tokenizer=qwen3, sample=ROWS, rewards_only=True)
    assert report.exit_code == 1
    assert any("earlier_token_ids" in m.field and m.row == 1 for m in report.mismatches), report.text()
    status = [m for m in report.mismatches if m.field == "status" and m.row == 1 and m.rollout == 0]
    assert status and f"sample 0 at position {at}" in status[0].note, report.text()
    assert not [m for m in report.mismatches if m.row == 1 and m.rollout == 1], "rollout 1 was not changed"


@pytest.fixture(scope="module")
def tiny_qwen3(tiny, qwen3):
    """The tiny model on the Qwen3 tokenizer, biased towards stopping and reasoning tokens (random weights rarely
    sample either; see tests/test_template_render.py)."""
    model, _ = tiny
    model = biased_to_stop_and_reason(model, qwen3)
    return TransformersAgent(model, qwen3, temperature=1.0, max_new_tokens=12, seed=0)


@pytest.fixture(scope="module")
def sampled(tiny_qwen3, qwen3, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny-samples")
    ds = generate_rollouts(tasks(), tiny_qwen3, 2, cache_dir=tmp / "c", progress=False, batch_size=2)
    return save(ds, qwen3, tmp / "out")


def first_agent_position(mask):
    return mask.index(1)


def test_the_tiny_models_branched_dataset_verifies_by_full_replay(sampled, tiny_qwen3, qwen3):
    ds = load_from_disk(str(sampled))
    counts = [n for row in ds["num_samples"] for n in row]
    assert max(counts) > 1, f"no episode branched: {counts}"
    report = report_of(sampled, tiny_qwen3, sample=ROWS)
    assert report.exit_code == 0 and not report.mismatches, report.text()
    rewards = report_of(sampled, None, tokenizer=qwen3, sample=ROWS, rewards_only=True)
    assert rewards.exit_code == 0 and not rewards.mismatches, rewards.text()


def test_a_changed_agent_token_of_an_earlier_sample_is_named_by_full_replay(sampled, tiny_qwen3, tmp_path):
    ds = load_from_disk(str(sampled))
    row, rollout = next((i, r) for i in range(ROWS) for r in range(2) if ds[i]["num_samples"][r] > 1)
    at = first_agent_position(ds[row]["earlier_agent_token_mask"][rollout][0])
    old = ds[row]["earlier_token_ids"][rollout][0][at]
    new = (old + 1) % len(tiny_qwen3.tokenizer)

    def change(per_rollout):
        out = [[list(s) for s in samples] for samples in per_rollout]
        out[rollout][0][at] = new
        return out

    bad = tampered(sampled, tmp_path, lambda d: edit_cell("earlier_token_ids", row, change)(d))
    report = report_of(bad, tiny_qwen3, sample=ROWS)
    hits = [m for m in report.mismatches if m.field == "earlier sample 0 agent token"]
    assert report.exit_code == 1 and hits, report.text()
    assert (hits[0].row, hits[0].rollout, hits[0].position, hits[0].stored, hits[0].found) == (
        row, rollout, at, new, old
    ), report.text()  # fmt: skip


def test_a_programs_branched_rows_verify_with_the_stored_agent_ids_decoded(tokenizer, tmp_path):
    """A ProgramEnv row's conversation is the program's own copy of the history (here an edited one): played back,
    each turn's text is the stored agent ids decoded (what the program received), so its reward is derived again;
    the edited copy branches the episode into two samples."""
    from test_program_env import ALLOW, TokenScript, rows, run

    ds = run(rows("edited_history", [{"question": "Tell me.", "expected": ["a reply", "a reply"]}]),
             TokenScript(tokenizer, lambda r: "a reply"), tokenizer)  # fmt: skip
    assert ds[0]["final_rewards"] == [1.0] and ds[0]["num_samples"] == [2]
    assert "a reply" not in [m["content"] for m in ds[0]["conversations"][0] if m["role"] == "assistant"][:1]
    saved = save(ds, tokenizer, tmp_path / "out")
    report = report_of(saved, None, tokenizer=tokenizer, rewards_only=True, allowed_env_modules=ALLOW)
    assert report.exit_code == 0 and not report.mismatches, report.text()
