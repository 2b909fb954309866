"""Samples: one episode, one or more stored token sequences (hf_rollouts.sample, EpisodeRecorder.add_call).

Every call is recorded from the exact prompt ids the model was conditioned on. A prompt that extends the current
sample joins it; any other starts a new sample. The invariants checked here on the real embedded tokenizer: agent
tokens are exactly the sampled ids, each call's prompt is a prefix of its sample, rewards only on agent tokens, and
the new rollout columns store (and give back) every sample.
"""

from __future__ import annotations

import math

import pytest
from datasets import Dataset, Features

from hf_rollouts.chat import ChatDelta
from hf_rollouts.rollout.padding import pad_task
from hf_rollouts.rollout.recorder import AgentOutputError, EnvOutputError, EpisodeRecorder
from hf_rollouts.sample import Sample, extends
from hf_rollouts.schema import ROLLOUT_FEATURES, TASK_FEATURES, as_stored
from hf_rollouts.types import Action, Episode


def render(tok, messages):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_ids(tok, messages):
    return tok(render(tok, messages), add_special_tokens=False)["input_ids"]


def sampled(tok, text, logprob=-0.5):
    """An Action as a token-level agent answers: the text's ids plus the template's end token, with log-probs."""
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return Action(text=text, token_ids=ids, logprobs=[logprob] * len(ids), stopped=True)


def three_calls(tok):
    """Calls 1 and 2 extend each other (the program kept its history); call 3 compacted it (a new sample)."""
    m1 = [{"role": "user", "content": "Guess my number."}]
    a1 = sampled(tok, "Is it 3?", -0.25)
    m2 = [*m1, {"role": "assistant", "content": a1.text}, {"role": "user", "content": "Higher."}]
    a2 = sampled(tok, "Is it 7?", -0.5)
    m3 = [{"role": "user", "content": "Summary: 3 was low. Guess again."}]  # history replaced by a summary
    a3 = sampled(tok, "Is it 5?", -0.75)
    return [(m1, a1), (m2, a2), (m3, a3)]


def record(tok, calls, rewards=(0.0, 0.0, 0.0)):
    rec = EpisodeRecorder(ChatDelta(tok))
    prompts, branched = [], []
    for (messages, action), reward in zip(calls, rewards):
        prompt = prompt_ids(tok, messages)
        prompts.append(prompt)
        branched.append(rec.add_call(prompt, action, messages=messages))
        rec.reward_turn(reward)
    return rec, prompts, branched


def test_extension_rule():
    assert extends([1, 2, 3], [1, 2]) and extends([1, 2], [1, 2]) and extends([5], [])
    assert not extends([1, 3, 2], [1, 2]) and not extends([1], [1, 2])


def test_a_call_that_extends_joins_and_one_that_does_not_starts_a_new_sample(tokenizer):
    calls = three_calls(tokenizer)
    rec, prompts, branched = record(tokenizer, calls)
    assert branched == [False, False, True]
    assert extends(prompts[1], prompts[0]) and not extends(prompts[2], prompts[1])
    ep = rec.finish("done", 1.0)
    assert ep.num_samples == 2 and ep.sample_calls == [2, 1] and ep.calls_per_sample == [2, 1]
    first, last = ep.samples
    assert first == ep.earlier_samples[0] and first.num_calls == 2 and last.num_calls == 1
    # each call's prompt is a prefix of its sample, and its agent tokens are exactly the sampled ids
    holders = [first, first, last]
    for turn, prompt, (_, action), sample in zip(ep.turns, prompts, calls, holders):
        assert sample.full_token_ids[: turn.start] == prompt
        assert sample.full_token_ids[turn.start : turn.end] == action.token_ids
        assert sample.agent_token_mask[turn.start : turn.end] == [1] * len(action.token_ids)
        assert sample.sampled_token_mask[turn.start : turn.end] == [1] * len(action.token_ids)
        assert sample.logprobs[turn.start : turn.end] == action.logprobs
    # agent tokens are the sampled ids and nothing else; the new sample's env tokens are its whole prompt
    for sample, actions in ((first, calls[:2]), (last, calls[2:])):
        agent = [t for t, m in zip(sample.full_token_ids, sample.agent_token_mask) if m]
        assert agent == [t for _, a in actions for t in a.token_ids]
        assert all(p == 0.0 for p, m in zip(sample.logprobs, sample.agent_token_mask) if not m)
    assert last.full_token_ids[: len(prompts[2])] == prompts[2] and not any(last.agent_token_mask[: len(prompts[2])])
    # the second call's env tokens are the delta its prompt adds to the first call's stored ids
    assert first.full_token_ids[ep.turns[0].end : ep.turns[1].start] == prompts[1][ep.turns[0].end :]
    assert ep.messages[0]["content"].startswith("Summary") and ep.messages[-1] == {
        "role": "assistant",
        "content": "Is it 5?",
    }


def test_step_rewards_land_on_the_agent_tokens_of_the_sample_holding_the_call(tokenizer):
    rec, _, _ = record(tokenizer, three_calls(tokenizer), rewards=(0.5, 0.0, 2.0))
    ep = rec.finish("done", 3.0)
    first, last = ep.samples
    assert sum(first.per_token_rewards) == 0.5 and first.per_token_rewards[ep.turns[0].end - 1] == 0.5
    assert sum(last.per_token_rewards) == 2.0 and last.per_token_rewards[ep.turns[2].end - 1] == 2.0
    ep.check()


def test_a_text_only_call_is_tokenized_once_and_not_marked_sampled(tokenizer):
    rec = EpisodeRecorder(ChatDelta(tokenizer))
    messages = [{"role": "user", "content": "hi"}]
    rec.add_call(prompt_ids(tokenizer, messages), Action(text="hello"))
    ep = rec.finish("done", 0.0)
    assert ep.num_samples == 1 and ep.sample_calls == [] and ep.calls_per_sample == [1]
    assert sum(ep.agent_token_mask) > 0 and sum(ep.sampled_token_mask) == 0 and ep.logprobs is None


def test_bad_prompts_are_refused_before_anything_is_recorded(tokenizer):
    rec = EpisodeRecorder(ChatDelta(tokenizer))
    action = sampled(tokenizer, "x")
    for bad in ("text", [1, len(tokenizer)], [1, -1], [True, 2], None):
        with pytest.raises(AgentOutputError):
            rec.add_call(bad, action)
    with pytest.raises(AgentOutputError, match="instead of an Action"):
        rec.add_call([1, 2], "just text")
    assert rec.ids == [] and rec.turns == []


def test_an_error_snapshot_keeps_the_closed_samples(tokenizer):
    rec, _, _ = record(tokenizer, three_calls(tokenizer))
    ep = rec.snapshot_error("RuntimeError: stopped")
    assert ep.status == "error" and math.isnan(ep.final_reward)
    assert ep.num_samples == 2 and ep.sample_calls == [2, 1] and len(ep.turns) == 3


def test_check_refuses_broken_samples(tokenizer):
    rec, _, _ = record(tokenizer, three_calls(tokenizer))
    ep = rec.finish("done", 1.0)
    ep.check()
    first = ep.earlier_samples[0]
    broken = Sample(first.full_token_ids, first.agent_token_mask, first.sampled_token_mask, first.per_token_rewards,
                    first.logprobs[:-1], first.num_calls)  # fmt: skip
    for bad in (
        {"earlier_samples": [broken]},
        {"sample_calls": [1, 1]},  # does not match the earlier sample's calls
        {"sample_calls": [2, 2]},  # does not sum to num_turns
        {"sample_calls": []},  # earlier samples need their calls
    ):
        with pytest.raises(AssertionError):
            Episode.from_dict({**ep.to_dict(), **bad}).check()
    rewarded = Sample(first.full_token_ids, first.agent_token_mask, first.sampled_token_mask,
                      [1.0] + first.per_token_rewards[1:], first.logprobs, 2)  # fmt: skip
    with pytest.raises(AssertionError, match="sample 0: reward on a non-agent token"):
        Episode.from_dict({**ep.to_dict(), "earlier_samples": [rewarded]}).check()


def test_episode_dicts_round_trip_with_their_samples(tokenizer):
    rec, _, _ = record(tokenizer, three_calls(tokenizer))
    ep = rec.finish("done", 1.0)
    d = ep.to_dict()
    assert d["num_samples"] == 2 and d["calls_per_sample"] == [2, 1] and isinstance(d["earlier_samples"][0], dict)
    back = Episode.from_dict(d)
    assert back == ep and back.earlier_samples[0] == ep.earlier_samples[0]


def test_the_sample_columns_are_stored_per_rollout_and_read_back(tokenizer):
    """Two rollouts of one task, one with two samples and one append-only: the padded columns hold each rollout's
    last sample (equal lengths), the earlier_* columns the others, unpadded; a Dataset stores and gives them back."""
    rec, _, _ = record(tokenizer, three_calls(tokenizer), rewards=(0.5, 0.0, 0.0))
    multi = rec.finish("done", 1.0)
    rec = EpisodeRecorder(ChatDelta(tokenizer))
    rec.add_call(prompt_ids(tokenizer, [{"role": "user", "content": "a much longer opening message " * 4}]),
                 sampled(tokenizer, "ok"))  # fmt: skip
    single = rec.finish("done", 0.0)
    columns = pad_task([multi, single], tokenizer.pad_token_id)
    assert columns["num_samples"] == [2, 1] and columns["sample_calls"] == [[2, 1], [1]]
    assert columns["earlier_token_ids"] == [[multi.earlier_samples[0].full_token_ids], []]
    assert columns["earlier_logprobs"] == [[multi.earlier_samples[0].logprobs], []]
    width = len(columns["padded_full_token_ids"][0])
    assert all(len(row) == width for row in columns["padded_full_token_ids"])
    assert columns["padded_full_token_ids"][0][: len(multi.full_token_ids)] == multi.full_token_ids
    row = {"env_class_path": "x", "env_config": "{}", "task_data": "{}", **columns}
    stored = Dataset.from_list([row], features=Features({**TASK_FEATURES, **ROLLOUT_FEATURES}))[0]
    assert stored["num_samples"] == [2, 1] and stored["sample_calls"] == [[2, 1], [1]]
    assert stored["earlier_token_ids"] == columns["earlier_token_ids"]
    assert stored["earlier_per_token_rewards"][0][0] == multi.earlier_samples[0].per_token_rewards
    assert as_stored({"earlier_agent_token_mask": [columns["earlier_agent_token_mask"]]})[
        "earlier_agent_token_mask"
    ] == [columns["earlier_agent_token_mask"]]


def test_an_earlier_sample_without_logprobs_stores_null(tokenizer):
    rec = EpisodeRecorder(ChatDelta(tokenizer))
    rec.add_call(prompt_ids(tokenizer, [{"role": "user", "content": "one"}]), Action(text="a"))
    rec.add_call(prompt_ids(tokenizer, [{"role": "user", "content": "two"}]), sampled(tokenizer, "b"))
    ep = rec.finish("done", 0.0)
    assert ep.earlier_logprobs == [None] and ep.logprobs is not None
    stored = as_stored({"earlier_logprobs": [pad_task([ep], tokenizer.pad_token_id)["earlier_logprobs"]]})
    assert stored["earlier_logprobs"] == [[[None]]]  # [task row][rollout][sample]


def test_messages_the_conversations_column_cannot_hold_are_refused(tokenizer):
    """A request's content parts (a list) would fail only when the dataset is written: refused at the call."""
    rec = EpisodeRecorder(ChatDelta(tokenizer))
    prompt, action = prompt_ids(tokenizer, [{"role": "user", "content": "hi"}]), sampled(tokenizer, "x")
    for bad, match in (
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "message 0's content must be a str"),
        ([{"content": "hi"}], "message 0 must be a dict with a str 'role'"),
        ("hi", "messages must be a list"),
    ):
        with pytest.raises(EnvOutputError, match=match):
            rec.add_call(prompt, action, messages=bad)
    assert rec.ids == [] and rec.turns == []
    rec.add_call(prompt, action, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert len(rec.turns) == 1
