"""Stop strings (SamplingConfig.stop), token-exact: every sampled id up to the token completing the stop string is
stored as sampled, for the local agent (both backends) and an OpenAI-compatible server (vLLM's protocol)."""

from __future__ import annotations

import pytest

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.openai.chat_mode import chat_action
from hf_rollouts.agents.openai.completions import completion_action
from hf_rollouts.agents.openai.negotiation import Capabilities
from hf_rollouts.agents.sampling import SamplingConfig
from hf_rollouts.agents.stop_strings import stop_string_end
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.types import AgentRequest


def _requests(agent, n=6):
    return [
        AgentRequest(
            messages=[],
            prompt_token_ids=agent.chat.initial_ids([{"role": "user", "content": f"Say something {i}"}]),
            seed=100 + i,
            session_id=f"s{i}",
        )
        for i in range(n)
    ]


def test_stop_string_end_is_the_token_that_completes_it(tokenizer):
    ids = tokenizer("The answer is <answer>42</answer> and more text", add_special_tokens=False)["input_ids"]
    n = stop_string_end(tokenizer, ids, ["</answer>"])
    assert "</answer>" in tokenizer.decode(ids[:n]) and "</answer>" not in tokenizer.decode(ids[: n - 1])
    assert stop_string_end(tokenizer, ids, ["<never>"]) is None
    assert stop_string_end(tokenizer, ids, []) is None
    first = stop_string_end(tokenizer, ids, ["</answer>", "answer"])  # the first stop string to appear wins
    assert first < n and "answer" in tokenizer.decode(ids[:first])


def test_sampling_config_validates_stop():
    assert SamplingConfig(stop=("</a>",)).stop == ["</a>"]
    with pytest.raises(ValueError, match="list of strings"):
        SamplingConfig(stop="</answer>")
    with pytest.raises(ValueError, match="non-empty"):
        SamplingConfig(stop=[""])


@pytest.mark.parametrize("stops", [["e"], ["er", "o", "a"]])
def test_local_agent_stops_on_strings_and_keeps_the_sampled_ids(tiny, stops):
    model, tok = tiny
    free = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=16, seed=0)
    stopping = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=16, seed=0, stop=stops)
    hits = 0
    for (a, _), (b, _) in zip(free.act_batch(_requests(free)), stopping.act_batch(_requests(free))):
        # the same per-request random stream: the stopped turn is a prefix of the free one, cut at the stop
        assert b.token_ids == a.token_ids[: len(b.token_ids)] and b.logprobs == a.logprobs[: len(b.logprobs)]
        n = stop_string_end(tok, a.token_ids, stops)
        if n is None or (a.stopped and len(a.token_ids) <= n):
            assert b.token_ids == a.token_ids and b.stopped == a.stopped
            continue
        hits += 1
        assert len(b.token_ids) == n and b.stopped
        assert any(s in b.text for s in stops) and not any(s in tok.decode(b.token_ids[:-1]) for s in stops)
    assert hits >= 2


def test_stop_strings_in_a_multi_turn_run_keep_the_token_contract(tiny, recording):
    model, tok = tiny
    agent = recording(TransformersAgent(model, tok, temperature=1.0, max_new_tokens=16, seed=0, stop=["e"]))
    env = GuessNumberEnv(tok, {"max_turns": 3})
    out = env.run_trial([{"target": 3}, {"target": 7}], agent, num_rollouts=2)
    assert set(out["statuses"]) <= {"done", "truncated"}
    stopped_by_string = 0
    for k in range(4):
        ids = out["padded_full_token_ids"][k]
        log = agent.log[f"task{k // 2}/rollout{k % 2}"]
        for prompt, action in log:
            assert ids[: len(prompt)] == prompt  # what the model saw is a prefix of what is stored
            assert ids[len(prompt) : len(prompt) + len(action.token_ids)] == action.token_ids  # stored as sampled
            if action.stopped and action.token_ids[-1] not in agent.inner.stop_ids:
                stopped_by_string += 1
                # the template's closing follows as env tokens, not as agent tokens
                end = len(prompt) + len(action.token_ids)
                if end < sum(out["padded_full_attention_mask"][k]):
                    assert out["padded_agent_token_mask"][k][end] == 0
    assert stopped_by_string > 0 and sum(out["num_cut_turns"]) < sum(out["num_turns"])


def test_continuous_backend_cuts_after_the_fact(tiny):
    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, backend="continuous", stop=["e"])
    for action, _ in agent.act_batch(_requests(agent, 3)):
        n = stop_string_end(tok, action.token_ids, ["e"])
        assert n is None or (n == len(action.token_ids) and action.stopped)


def test_token_mode_text_is_decoded_from_all_returned_ids(tokenizer):
    ids = tokenizer("x <answer>7</answer>", add_special_tokens=False)["input_ids"]
    data = {"choices": [{"text": "x <answer>7", "token_ids": ids, "finish_reason": "stop", "stop_reason": "</answer>"}]}
    request = AgentRequest(messages=[], prompt_token_ids=[1, 2])
    caps = Capabilities(mode="tokens", returns_logprobs=False)
    action, _ = completion_action(data, request, caps, tokenizer=tokenizer, where="test", stop=["</answer>"])
    assert action.token_ids == ids and action.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert "</answer>" in action.text and action.stopped
    plain, _ = completion_action(data, request, caps, tokenizer=tokenizer, where="test")
    assert plain.text == "x <answer>7"  # without stop strings the server's text is used as before


def test_token_mode_cuts_what_a_server_that_ignored_stop_sampled_past_it(tokenizer):
    ids = tokenizer("x <answer>7</answer> and more", add_special_tokens=False)["input_ids"]
    logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
    entries = {"token_logprobs": logprobs, "tokens": [str(i) for i in ids]}
    data = {"choices": [{"text": "x <answer>7</answer> and more", "token_ids": ids, "logprobs": entries,
                         "finish_reason": "length", "stop_reason": None}]}  # fmt: skip
    request = AgentRequest(messages=[], prompt_token_ids=[1, 2])
    caps = Capabilities(mode="tokens", returns_logprobs=True)
    action, _ = completion_action(data, request, caps, tokenizer=tokenizer, where="test", stop=["</answer>"])
    n = stop_string_end(tokenizer, ids, ["</answer>"])
    assert n < len(ids) and action.token_ids == ids[:n] and action.logprobs == logprobs[:n]
    assert action.text.endswith("</answer>") and "more" not in action.text and action.stopped


def test_chat_mode_puts_back_a_trimmed_stop_string(tokenizer):
    data = {"choices": [{"message": {"content": "<answer>7"}, "finish_reason": "stop", "stop_reason": "</answer>"}]}
    request = AgentRequest(messages=[{"role": "user", "content": "q"}], prompt_token_ids=[])
    counts = []
    action = chat_action(data, request, tokenizer=tokenizer, policy="text", where="t", count=counts.append,
                         stop=["</answer>"])  # fmt: skip
    assert action.text == "<answer>7</answer>" and action.token_ids is None


def test_cli_parses_stop_strings():
    from transformers import HfArgumentParser

    (sampling,) = HfArgumentParser([SamplingConfig]).parse_args_into_dataclasses(["--stop", "</answer>", "</sql>"])
    assert sampling.stop == ["</answer>", "</sql>"]
    (plain,) = HfArgumentParser([SamplingConfig]).parse_args_into_dataclasses([])
    assert plain.stop == []
