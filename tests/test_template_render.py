"""Template-faithful play (env config ``template_mode: "render"``): each turn's prompt is the chat template's full
render of the conversation, as a deployed model sees it, and the episode branches into a new sample wherever the
template rewrites history (Qwen3 and DeepSeek-R1 drop the reasoning of earlier turns).

Real templates (tests/fixtures/chat_templates, thinking on) on the embedded tokenizer extended by each family's
special tokens, a token-level agent that samples reasoning, and the real TransformersAgent on the tiny model.
"""

from __future__ import annotations

import pytest
from test_chat_templates import (  # noqa: F401 (frozen_date: an autouse fixture)
    ANSWERS,
    END_TOKEN,
    PromptEnv,
    TokenAgent,
    biased_to_stop_and_reason,
    family_tokenizer,
    frozen_date,
    play,
)

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.chat.tool_turns import template_messages
from hf_rollouts.envs.config import EnvConfigError
from hf_rollouts.types import Episode

REASONING = {"qwen3": "<think>\nmaybe 3\n</think>\n\n", "deepseek_r1": "maybe 3\n</think>\n\n"}
THINKING = {"qwen3": {"enable_thinking": True}, "deepseek_r1": {}}


def full_render(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(template_messages(messages), tokenize=False, add_generation_prompt=True, **kwargs)


def sample_of(ep: Episode, turn: int):
    """The sample holding ``turn``, by ``sample_calls``."""
    bound = 0
    for sample, calls in zip(ep.samples, ep.calls_per_sample):
        bound += calls
        if turn < bound:
            return sample
    raise AssertionError(f"turn {turn} is in no sample ({ep.calls_per_sample})")


def check_render_play(tok, ep: Episode, log, kwargs) -> None:
    """Each turn's prompt (what the agent got, and the stored prefix of its sample) is the template's full render of
    the conversation at that turn; the agent tokens are exactly the sampled ids."""
    assistant_at = [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
    assert len(assistant_at) == len(ep.turns) == len(log)
    for t, (turn, (prompt, action), at) in enumerate(zip(ep.turns, log, assistant_at)):
        expected = full_render(tok, ep.messages[:at], **kwargs)
        assert tok.decode(prompt) == expected, f"turn {t}: the prompt is not the template's full render"
        assert prompt == tok(expected, add_special_tokens=False)["input_ids"]
        sample = sample_of(ep, t)
        assert sample.full_token_ids[: turn.start] == prompt, f"turn {t}: its prompt is not a prefix of its sample"
        assert sample.full_token_ids[turn.start : turn.end] == action.token_ids
        assert sample.sampled_token_mask[turn.start : turn.end] == [1] * len(action.token_ids)
    ep.check()


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_each_prompt_is_the_full_render_and_rewrites_branch(tokenizer, recording, name):
    tok = family_tokenizer(tokenizer, name)
    answers = [REASONING[name] + a for a in ANSWERS]
    agent = TokenAgent(tok, name, END_TOKEN[name], answers)
    kwargs = THINKING[name]
    ep, log = play(tok, name, agent, recording, template_mode="render", chat_template_kwargs=kwargs)
    ep = Episode.from_dict(ep)
    check_render_play(tok, ep, log, kwargs)
    # the reasoning of turn 1 is gone from turn 2's render: every turn after the first starts a new sample
    assert ep.num_samples == 3 and ep.calls_per_sample == [1, 1, 1]
    assert "maybe 3" not in tok.decode(log[1][0]) and "maybe 3" not in tok.decode(log[2][0])
    # each sample holds exactly what its call saw and sampled: one reasoning block, its own
    for sample in ep.samples:
        assert tok.decode(sample.full_token_ids).count("maybe 3") == 1


def test_without_a_rewrite_render_mode_stores_what_append_mode_stores(tokenizer, recording):
    """Qwen3 without reasoning in the answers (thinking on) rewrites nothing: one sample, the same ids as append."""
    tok = family_tokenizer(tokenizer, "qwen3")
    kwargs = THINKING["qwen3"]
    rendered, log = play(tok, "qwen3", TokenAgent(tok, "qwen3", END_TOKEN["qwen3"]), recording,
                         template_mode="render", chat_template_kwargs=kwargs)  # fmt: skip
    appended, _ = play(tok, "qwen3", TokenAgent(tok, "qwen3", END_TOKEN["qwen3"]), recording,
                       chat_template_kwargs=kwargs)  # fmt: skip
    ep = Episode.from_dict(rendered)
    check_render_play(tok, ep, log, kwargs)
    assert ep.num_samples == 1 and ep.sample_calls == []
    assert rendered["full_token_ids"] == appended["full_token_ids"]
    assert rendered["agent_token_mask"] == appended["agent_token_mask"]


def test_append_mode_is_the_default_and_keeps_one_sample(tokenizer, recording):
    tok = family_tokenizer(tokenizer, "qwen3")
    answers = [REASONING["qwen3"] + a for a in ANSWERS]
    ep, _ = play(tok, "qwen3", TokenAgent(tok, "qwen3", END_TOKEN["qwen3"], answers), recording)
    ep = Episode.from_dict(ep)
    assert ep.num_samples == 1 and tok.decode(ep.full_token_ids).count("maybe 3") == 3  # the sampled reasoning kept
    with pytest.raises(EnvConfigError, match="template_mode"):
        PromptEnv(tok, {"template_mode": "full"})


def test_the_tiny_model_in_render_mode(tiny, recording):
    """The real TransformersAgent (sampled ids and log-probs) on the Qwen3 template, thinking on, in render mode:
    every prompt is the full render; where the model's decoded text does not re-tokenize to its sampled ids the
    template's render does not extend the sample, and a new one starts."""
    model, base = tiny
    tok = family_tokenizer(base, "qwen3")
    model = biased_to_stop_and_reason(model, tok)
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, seed=0)
    kwargs = THINKING["qwen3"]
    ep, log = play(tok, "qwen3", agent, recording, template_mode="render", chat_template_kwargs=kwargs)
    ep = Episode.from_dict(ep)
    check_render_play(tok, ep, log, kwargs)
    assert ep.logprobs is not None and all(s.logprobs is not None for s in ep.samples)
    assert sum(ep.calls_per_sample) == ep.num_turns == 3


@pytest.mark.parametrize(("name", "samples"), [("qwen2_5", 1), ("hermes", 3)])
def test_tool_turns_in_render_mode(tokenizer, recording, name, samples):
    """Tool calls and results in render mode: each prompt is the full render with the env's tools. Qwen2.5 renders
    a past call turn as it was sampled (one sample, the ids of append mode); vLLM's Hermes template swaps the call's
    keys in history, so each turn after a call starts a new sample."""
    from test_tools import CalcEnv, ScriptAgent, scripts

    tok = family_tokenizer(tokenizer, name)
    env = CalcEnv(tok, {"template_mode": "render"})
    watch = recording(ScriptAgent(tok, name, scripts(name)))
    ep = Episode.from_dict(env._run_complete_episode("s", watch, {"target": 3}, on_error="raise"))
    assert ep.status == "done" and ep.final_reward == 1.0 and ep.num_tool_calls == 3
    log = watch.log["s"]
    assistant_at = [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
    for t, ((prompt, action), at) in enumerate(zip(log, assistant_at)):
        expected = tok.apply_chat_template(
            template_messages(ep.messages[:at]), tools=env.chat.tools, tokenize=False, add_generation_prompt=True
        )
        assert tok.decode(prompt) == expected
        sample, turn = sample_of(ep, t), ep.turns[t]
        assert sample.full_token_ids[: turn.start] == prompt
        assert sample.full_token_ids[turn.start : turn.end] == action.token_ids
    assert ep.num_samples == samples
    if samples == 1:
        appended = CalcEnv(tok, {})._run_complete_episode(
            "s", recording(ScriptAgent(tok, name, scripts(name))), {"target": 3}, on_error="raise"
        )
        assert appended["full_token_ids"] == ep.full_token_ids


def test_max_episode_tokens_counts_the_rendered_prompt(tokenizer):
    """In render mode the prompt a turn would get is the full render (not the stored ids): it is what
    max_episode_tokens bounds, on the first turn and after a branch alike."""
    tok = family_tokenizer(tokenizer, "qwen3")
    agent = TokenAgent(tok, "qwen3", END_TOKEN["qwen3"])
    first = PromptEnv(tok, {"max_turns": 1, "template_mode": "render"})._run_complete_episode("s", agent, {})
    limit = len(first["full_token_ids"]) + 1  # above the first turn's stored ids, below the second prompt's render
    for cap, turns in ((5, 0), (limit, 1)):
        env = PromptEnv(tok, {"max_turns": 3, "template_mode": "render", "max_episode_tokens": cap})
        agent = TokenAgent(tok, "qwen3", END_TOKEN["qwen3"])
        ep = env._run_complete_episode("s", agent, {}, on_error="raise")
        assert ep["status"] == "truncated" and ep["num_turns"] == turns
