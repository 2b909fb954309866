"""MultistepEnv: the seed's T2-T5 and every token-level invariant of DESIGN.md."""

from __future__ import annotations

import math

import pytest
import torch

from hf_rollouts import MultistepEnv, ScriptedAgent
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.rollout import pad_groups
from hf_rollouts.types import Action, Episode

R4_KEYS = {"full_token_ids", "full_attention_mask", "agent_token_mask", "per_token_rewards", "final_reward"}
R5_KEYS = {
    "padded_full_token_ids",
    "padded_full_attention_mask",
    "padded_agent_token_mask",
    "padded_per_token_rewards",
    "final_rewards",
}
PADDED = ["padded_full_token_ids", "padded_full_attention_mask", "padded_agent_token_mask", "padded_per_token_rewards"]


def check_invariants(ep: dict) -> None:
    n = len(ep["full_token_ids"])
    assert all(len(ep[k]) == n for k in ("full_attention_mask", "agent_token_mask", "per_token_rewards"))
    for m, r in zip(ep["agent_token_mask"], ep["per_token_rewards"]):
        assert m == 1 or r == 0.0
    assert ep["status"] in ("done", "truncated", "error")


# -- T2 -----------------------------------------------------------------------
def test_init_stores_tokenizer_and_config(tokenizer):
    env = MastermindEnv(tokenizer, {"code_length": 3, "num_symbols": 5, "max_guesses": 7})
    assert env.tokenizer is tokenizer
    assert env.env_config["code_length"] == 3
    assert (env.code_length, env.num_symbols, env.max_turns) == (3, 5, 7)


def test_base_class_has_no_rubric_and_is_abstract(tokenizer):
    assert not hasattr(MultistepEnv, "get_rubric")
    with pytest.raises(TypeError):
        MultistepEnv(tokenizer, {})


def test_bad_config_is_rejected(tokenizer):
    with pytest.raises(TypeError, match="env_config must be a dict"):
        MastermindEnv(tokenizer, ["code_length", 4])
    with pytest.raises(ValueError, match="max_turns"):
        MastermindEnv(tokenizer, {"max_turns": 0})


# -- T3 -----------------------------------------------------------------------
def test_run_complete_episode_with_scripted_agent(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 5})
    script = ["1 1 2 2", "not a guess", "4 5 2 4"]
    ep = env._run_complete_episode("s0", ScriptedAgent(script), {"code": [4, 5, 2, 4]})
    assert R4_KEYS <= set(ep)
    check_invariants(ep)
    assert ep["status"] == "done" and ep["error"] is None and ep["num_turns"] == 3
    assert ep["final_reward"] == 1.0
    # the agent mask marks exactly the scripted texts, tokenized once each, closed by the template's end token
    for turn, text in zip(ep["turns"], script):
        assert ep["full_token_ids"][turn.start : turn.end] == env.chat.encode(text) + [tokenizer.eos_token_id]
        assert all(ep["agent_token_mask"][turn.start : turn.end])
    assert sum(ep["agent_token_mask"]) == sum(len(env.chat.encode(t)) + 1 for t in script)
    # the step reward sits on the last token of the winning turn, nowhere else
    win = ep["turns"][-1]
    assert ep["per_token_rewards"][win.end - 1] == 1.0 and sum(ep["per_token_rewards"]) == 1.0
    # unpadded: the sequence ends with the agent's last token, no pad ids
    assert ep["full_token_ids"][-1] != tokenizer.pad_token_id and len(ep["full_token_ids"]) == win.end
    assert ep["logprobs"] is None  # a text agent reports none
    assert [m["role"] for m in ep["messages"]] == ["user", "assistant"] * 3


def test_truncated_episode_is_not_done(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    ep = env._run_complete_episode("s", ScriptedAgent(["1 1 1 1"]), {"code": [2, 2, 2, 2]})
    assert ep["status"] == "truncated" and ep["num_turns"] == 2 and ep["final_reward"] == 0.0


def test_spread_placement_keeps_the_reward_sum(tokenizer):
    env = MastermindEnv(tokenizer, {"reward_placement": "spread"})
    ep = env._run_complete_episode("s", ScriptedAgent(["2 2 2 2"]), {"code": [2, 2, 2, 2]})
    turn = ep["turns"][0]
    assert math.isclose(sum(ep["per_token_rewards"]), 1.0, rel_tol=1e-6)
    assert all(r > 0 for r in ep["per_token_rewards"][turn.start : turn.end])


def test_episode_error_is_recorded_never_a_zero_reward_success(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 4})
    ep = env._run_complete_episode("s", ScriptedAgent(["1 2 3 4"], fail_at={1}), {"code": [6, 6, 6, 6]})
    assert ep["status"] == "error" and "scripted failure at call 1" in ep["error"]
    assert math.isnan(ep["final_reward"])
    assert ep["num_turns"] == 1 and sum(ep["agent_token_mask"]) > 0  # the partial trajectory is kept
    check_invariants(ep)
    with pytest.raises(RuntimeError, match="scripted failure"):
        env._run_complete_episode(
            "s", ScriptedAgent(["1 2 3 4"], fail_at={0}), {"code": [6, 6, 6, 6]}, on_error="raise"
        )


def test_env_error_on_bad_task_data_is_recorded(tokenizer):
    env = MastermindEnv(tokenizer, {})
    ep = env._run_complete_episode("s", ScriptedAgent(["1 2 3 4"]), {"code": [9, 9]})
    assert ep["status"] == "error" and "does not fit" in ep["error"] and ep["num_turns"] == 0


# -- T4 -----------------------------------------------------------------------
def test_run_trial_calls_each_episode_and_pads_per_task(tokenizer, monkeypatch):
    env = MastermindEnv(tokenizer, {"max_turns": 4})
    calls = []
    real = env._run_complete_episode

    def counting(session_id, agent, task_data, **kw):
        calls.append(session_id)
        return real(session_id, agent, task_data, **kw)

    monkeypatch.setattr(env, "_run_complete_episode", counting)
    tasks = [{"code": [1, 2, 3, 4]}, {"code": [6, 6, 6, 6]}]  # solved at turn 1 / never solved
    out = env.run_trial(tasks, ScriptedAgent(["1 2 3 4"]), num_rollouts=3)
    assert len(calls) == len(set(calls)) == 6
    assert R5_KEYS <= set(out)
    assert all(len(out[k]) == 6 for k in PADDED + ["final_rewards", "statuses"])
    lengths = [[len(out[k][i]) for k in PADDED] for i in range(6)]
    assert all(len(set(row)) == 1 for row in lengths)
    assert len({lengths[i][0] for i in range(3)}) == 1 and len({lengths[i][0] for i in range(3, 6)}) == 1
    assert lengths[0][0] < lengths[3][0]  # different tasks, different padded lengths
    assert out["final_rewards"] == [1.0] * 3 + [0.0] * 3
    assert out["statuses"] == ["done"] * 3 + ["truncated"] * 3


def test_padding_values(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 3})
    # a group with unequal lengths: one rollout solves at once, one a turn later
    group = pad_groups(
        [
            Episode.from_dict(env._run_complete_episode("a", ScriptedAgent(["1 2 3 4"]), {"code": [1, 2, 3, 4]})),
            Episode.from_dict(
                env._run_complete_episode("b", ScriptedAgent(["5 5 5 5", "1 2 3 4"]), {"code": [1, 2, 3, 4]})
            ),
        ],
        2,
        tokenizer.pad_token_id,
    )[0]
    short = sum(group["padded_full_attention_mask"][0])
    width = len(group["padded_full_token_ids"][0])
    assert short < width == len(group["padded_full_token_ids"][1]) == sum(group["padded_full_attention_mask"][1])
    assert group["padded_full_token_ids"][0][short:] == [tokenizer.pad_token_id] * (width - short)
    for key in ("padded_full_attention_mask", "padded_agent_token_mask", "padded_per_token_rewards"):
        assert group[key][0][short:] == [0] * (width - short)


# -- T5 and token-in/token-out with the real model ----------------------------
@pytest.mark.parametrize("backend, reuse_kv", [("generate", True), ("generate", False), ("continuous", False)])
def test_sampled_ids_are_stored_verbatim_and_prompts_are_prefixes(tokenizer, tiny, recording, backend, reuse_kv):
    from hf_rollouts.agents.hf import TransformersAgent

    env = MastermindEnv(tokenizer, {"max_turns": 3})
    inner = TransformersAgent(tiny[0], tokenizer, max_new_tokens=6, backend=backend, reuse_kv=reuse_kv)
    agent = recording(inner)
    out = env.run_trial([{"code": [1, 2, 3, 4]}, {"code": [3, 3, 1, 1]}], agent, num_rollouts=2)
    assert inner.kv_reused_calls == (inner.generate_calls - 1 if reuse_kv and backend == "generate" else 0)
    assert sorted(agent.log) == sorted(f"task{t}/rollout{r}" for t in range(2) for r in range(2))
    for i, session in enumerate(f"task{t}/rollout{r}" for t in range(2) for r in range(2)):
        ids = out["padded_full_token_ids"][i]
        mask = out["padded_agent_token_mask"][i]
        lps = out["padded_logprobs"][i]
        sampled_positions = []
        for prompt, action in agent.log[session]:
            assert ids[: len(prompt)] == prompt  # what the model saw is a prefix of what is stored
            span = range(len(prompt), len(prompt) + len(action.token_ids))
            assert [ids[p] for p in span] == action.token_ids  # exactly the sampled ids
            assert all(mask[p] == 1 for p in span)
            assert [lps[p] for p in span] == pytest.approx(action.logprobs)
            sampled_positions += list(span)
        assert [p for p, m in enumerate(mask) if m] == sampled_positions  # nothing else is marked agent
        assert all(r == 0.0 or mask[p] for p, r in enumerate(out["padded_per_token_rewards"][i]))
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        assert all(lp <= 0.0 for lp, m in zip(lps, mask) if m)
        # each continuation was sampled from its own prefix: a teacher-forced pass reproduces its log-probs
        n = sum(out["padded_full_attention_mask"][i])
        with torch.no_grad():
            logits = tiny[0](torch.tensor([ids[:n]], device=tiny[0].device)).logits[0].float().cpu()
        recomputed = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:n]).unsqueeze(-1)).squeeze(-1)
        for p in sampled_positions:
            assert recomputed[p - 1].item() == pytest.approx(lps[p], abs=2e-3)


def test_text_agent_and_token_agent_mix_in_one_conversation(tokenizer):
    """A turn without ids is tokenized once; a later turn with ids is stored verbatim."""
    from hf_rollouts.agents.base import Agent

    ids_turn = tokenizer("6 6 6 6", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class Mixed(Agent):
        def get_action(self, messages, agent_state=None):
            if not agent_state:
                return "1 2 3 4", 1
            return Action(text="6 6 6 6", token_ids=ids_turn, logprobs=[-0.5] * len(ids_turn)), 2

    env = MastermindEnv(tokenizer, {})
    ep = env._run_complete_episode("m", Mixed(), {"code": [6, 6, 6, 6]})
    first, second = ep["turns"]
    assert ep["full_token_ids"][second.start : second.end] == ids_turn
    assert all(math.isnan(x) for x in ep["logprobs"][first.start : first.end])  # no logprobs for text turns
    assert ep["logprobs"][second.start : second.end] == [-0.5] * len(ids_turn)


def test_agent_fingerprint_follows_the_weights(tiny):
    import torch

    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    agent = TransformersAgent(model, tok)
    before = agent.fingerprint()
    last = list(model.parameters())[-1]
    with torch.no_grad():
        last.add_(1e-3)
    try:
        assert agent.fingerprint() != before  # an optimizer step anywhere must invalidate cached samples
        assert TransformersAgent(model, tok, temperature=0.5).fingerprint() != agent.fingerprint()
    finally:
        with torch.no_grad():
            last.sub_(1e-3)


def test_sampled_mask_tells_reported_ids_from_retokenized_text(tokenizer):
    from hf_rollouts.agents.base import Agent

    ids_turn = tokenizer("6 6 6 6", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class Mixed(Agent):
        def get_action(self, messages, agent_state=None):
            if not agent_state:
                return "1 2 3 4", 1  # text only: re-tokenized by the env
            return Action(text="6 6 6 6", token_ids=ids_turn), 2

    ep = MastermindEnv(tokenizer, {})._run_complete_episode("m", Mixed(), {"code": [6, 6, 6, 6]})
    first, second = ep["turns"]
    assert ep["sampled_token_mask"][first.start : first.end] == [0] * (first.end - first.start)
    assert ep["sampled_token_mask"][second.start : second.end] == [1] * len(ids_turn)
    assert sum(ep["sampled_token_mask"]) == len(ids_turn)  # nothing outside agent turns


@pytest.mark.parametrize("backend", ["generate", "continuous"])
def test_sampling_uses_the_full_softmax_the_logprobs_describe(tiny, backend):
    """transformers' default top_k=50 must not narrow sampling behind the stored log-probs' back."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    model, tok = tiny
    agent = TransformersAgent(model, tok, max_new_tokens=1, temperature=1.0, backend=backend)
    prompt = agent.chat.initial_ids([{"role": "user", "content": "Is it a clock?"}])
    results = agent.act_batch([AgentRequest([], prompt)] * 256)
    first = {action.token_ids[0] for action, _ in results}
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt], device=model.device)).logits[0, -1].float(), -1).cpu()
    expected_distinct = float((1 - (1 - probs) ** 256).sum())  # E[#distinct ids in 256 full-softmax draws]
    assert expected_distinct > 100
    assert len(first) > 0.8 * expected_distinct  # a top-50 sampler could never exceed 50


def test_kv_reuse_changes_nothing_but_the_work(tokenizer, tiny):
    """Greedy decoding with the kept KV cache (holes, dropped rows) gives the ids of a full prefill each turn."""
    from hf_rollouts.agents.hf import TransformersAgent

    def play(reuse_kv):
        agent = TransformersAgent(tiny[0], tokenizer, max_new_tokens=5, temperature=0.0, reuse_kv=reuse_kv)
        env = MastermindEnv(tokenizer, {"max_turns": 4})
        agent_script = env.run_trial([{"code": [1, 2, 3, 4]}, {"code": [6, 5, 4, 3]}, {"code": [2, 2, 2, 2]}], agent, 2)
        return agent, agent_script

    reused_agent, reused = play(True)
    full_agent, full = play(False)
    assert reused_agent.kv_reused_calls == reused_agent.generate_calls - 1 > 0 and full_agent.kv_reused_calls == 0
    assert reused["padded_full_token_ids"] == full["padded_full_token_ids"]
    for a, b in zip(reused["padded_logprobs"], full["padded_logprobs"]):
        assert a == pytest.approx(b, abs=1e-4)


def test_kv_cache_is_rebuilt_when_a_prompt_does_not_extend_what_was_seen(tokenizer, tiny):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    agent = TransformersAgent(tiny[0], tokenizer, max_new_tokens=3)
    chat = agent.chat
    first = chat.initial_ids([{"role": "user", "content": "Is it a clock?"}])
    ((action, _),) = agent.act_batch([AgentRequest([], first, session_id="s")])
    follow = first + action.token_ids + chat.user_delta_ids("No", action.token_ids)
    agent.act_batch([AgentRequest([], follow, session_id="s")])
    assert agent.kv_reused_calls == 1
    edited = list(follow)
    edited[1] = edited[2]  # history rewritten: the cache no longer matches, so it must not be used
    agent.act_batch([AgentRequest([], edited + [5], session_id="s")])
    assert agent.kv_reused_calls == 1 and agent.generate_calls == 3


def test_kv_reuse_after_an_episode_left_the_batch(tokenizer, tiny):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    reuse = TransformersAgent(tiny[0], tokenizer, max_new_tokens=4, temperature=0.0)
    fresh = TransformersAgent(tiny[0], tokenizer, max_new_tokens=4, temperature=0.0, reuse_kv=False)
    chat = reuse.chat
    a = chat.initial_ids([{"role": "user", "content": "Is it a clock?"}])
    b = chat.initial_ids([{"role": "user", "content": "Guess the number between 1 and 10. Answer with one number."}])
    (_, _), ((act_b, _)) = reuse.act_batch([AgentRequest([], a, session_id="a"), AgentRequest([], b, session_id="b")])
    follow = b + act_b.token_ids + chat.user_delta_ids("Higher.", act_b.token_ids)
    ((kept, _),) = reuse.act_batch([AgentRequest([], follow, session_id="b")])  # episode "a" has finished
    ((full, _),) = fresh.act_batch([AgentRequest([], follow, session_id="b")])
    assert reuse.kv_reused_calls == 1
    assert kept.token_ids == full.token_ids and kept.logprobs == pytest.approx(full.logprobs, abs=1e-4)


def test_set_seed_drops_the_kept_kv_cache(tokenizer, tiny):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    agent = TransformersAgent(tiny[0], tokenizer, max_new_tokens=2)
    prompt = agent.chat.initial_ids([{"role": "user", "content": "Is it a clock?"}])
    ((action, _),) = agent.act_batch([AgentRequest([], prompt, session_id="s")])
    agent.set_seed(1)  # e.g. the next map batch, after an optimizer step
    follow = prompt + action.token_ids + agent.chat.user_delta_ids("No", action.token_ids)
    agent.act_batch([AgentRequest([], follow, session_id="s")])
    assert agent.kv_reused_calls == 0


def test_model_generation_defaults_cannot_reshape_sampling(tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(cache_dir=tmp_path)
    model.generation_config.repetition_penalty = 5.0  # as some checkpoints ship
    model.generation_config.no_repeat_ngram_size = 1
    agent = TransformersAgent(model, tok)
    effective, _ = model._prepare_generation_config(agent._generation_config())
    assert effective.repetition_penalty in (None, 1.0) and not effective.no_repeat_ngram_size
    assert effective.top_k == 0 and effective.do_sample


def test_kv_reuse_is_switched_off_where_masked_columns_matter(tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    from hf_rollouts.agents.hf import TransformersAgent, kv_reuse_unsafe_reason

    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=24,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = MistralForCausalLM(config)
    assert "sliding-window" in kv_reuse_unsafe_reason(model)
    assert TransformersAgent(model, tokenizer).reuse_kv is False


def test_a_failing_request_is_isolated_from_its_batch(tokenizer, tiny, monkeypatch):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    agent = TransformersAgent(tiny[0], tokenizer, max_new_tokens=2)
    real = agent._act_batch

    def fragile(requests):  # e.g. one prompt too long for the model: the whole batched call fails
        if any(r.session_id == "bad" for r in requests):
            raise RuntimeError("prompt too long")
        return real(requests)

    monkeypatch.setattr(agent, "_act_batch", fragile)
    prompt = agent.chat.initial_ids([{"role": "user", "content": "hi"}])
    results = agent.act_batch([AgentRequest([], prompt, session_id=s) for s in ("a", "bad", "c", "d")])
    assert isinstance(results[1], RuntimeError)
    assert all(not isinstance(r, Exception) and r[0].token_ids for i, r in enumerate(results) if i != 1)


def test_only_sampling_defaults_are_warned_about(tmp_path, caplog):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(cache_dir=tmp_path)
    with caplog.at_level("WARNING"):
        TransformersAgent(model, tok)
    assert "ignores the model's generation defaults" not in caplog.text  # use_cache & co. change nothing
    model.generation_config.repetition_penalty = 1.3
    with caplog.at_level("WARNING"):
        TransformersAgent(model, tok)
    assert "['repetition_penalty']" in caplog.text


def test_turns_cut_by_the_token_budget_are_counted(tokenizer, tiny):
    from hf_rollouts.agents.hf import TransformersAgent

    env = MastermindEnv(tokenizer, {"max_turns": 3})
    agent = TransformersAgent(tiny[0], tokenizer, max_new_tokens=1)  # one token: almost never an end-of-turn
    out = env.run_trial([{"code": [1, 2, 3, 4]}], agent, 2)
    for cut, turns, ids, mask in zip(
        out["num_cut_turns"], out["num_turns"], out["padded_full_token_ids"], out["padded_agent_token_mask"]
    ):
        ended = sum(1 for t, m in zip(ids, mask) if m and t in agent.stop_ids)
        assert cut == turns - ended  # every turn either sampled its end-of-turn token or was cut
    ep = env._run_complete_episode("s", ScriptedAgent(["1 1 1 1"]), {"code": [2, 2, 2, 2]})
    assert ep["num_cut_turns"] == 0  # text agents are never cut
