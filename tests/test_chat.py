"""ChatDelta: conversations are built by appending deltas, never by re-rendering history."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from hf_rollouts.chat import ChatDelta, ChatTemplateError
from hf_rollouts.tiny_model import build_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chatml_tokenizer() -> PreTrainedTokenizerFast:
    """A real tokenizer with a Qwen3-style template: it drops past <think> blocks, so it is NOT prefix-preserving."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def test_initial_ids_equal_the_template_render(tokenizer):
    chat = ChatDelta(tokenizer)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is it a clock?"}]
    expected = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert chat.initial_ids(msgs) == expected


def test_deltas_reproduce_the_full_render_for_an_append_only_template(tokenizer):
    chat = ChatDelta(tokenizer)
    u1, a1, u2 = "Is it alive?", "Is it an animal?", "No."
    agent_ids = chat.encode(a1) + [tokenizer.eos_token_id]
    built = chat.initial_ids([{"role": "user", "content": u1}]) + agent_ids + chat.user_delta_ids(u2, agent_ids)
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": u1}, {"role": "assistant", "content": a1}, {"role": "user", "content": u2}],
        tokenize=True,
        add_generation_prompt=True,
    )["input_ids"]
    assert built == full


def test_closing_depends_on_whether_the_agent_sampled_the_end_token(chatml_tokenizer):
    chat = ChatDelta(chatml_tokenizer)
    end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.assistant_closing == "<|im_end|>\n"
    assert end in chat.stop_token_ids
    assert chat.framing.history_end == "<|im_end|>" and chat.turn_ended(chat.encode("hi") + [end])
    assert not chat.turn_ended(chat.encode("hi"))  # cut off by the token budget
    delta = chat.user_delta_ids("Yes.", chat.encode("hi") + [end])
    assert chatml_tokenizer.decode(delta) == "\n<|im_start|>user\nYes.<|im_end|>\n<|im_start|>assistant\n"
    delta = chat.user_delta_ids("Yes.", chat.encode("hi"))
    assert chatml_tokenizer.decode(delta) == "<|im_end|>\n<|im_start|>user\nYes.<|im_end|>\n<|im_start|>assistant\n"


def test_stored_ids_stay_a_prefix_where_re_rendering_would_rewrite_history(chatml_tokenizer):
    """The Qwen3 family drops past <think> blocks on re-render; deltas keep what the model saw."""
    chat = ChatDelta(chatml_tokenizer)
    end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    msgs = [{"role": "user", "content": "Guess my object."}]
    ids = chat.initial_ids(msgs)
    sampled = chat.encode("<think>maybe a clock</think>Is it alive?") + [end]
    seen_at_turn_2 = ids + sampled + chat.user_delta_ids("No.", sampled)
    assert seen_at_turn_2[: len(ids)] == ids
    assert seen_at_turn_2[len(ids) : len(ids) + len(sampled)] == sampled
    msgs += [
        {"role": "assistant", "content": "<think>maybe a clock</think>Is it alive?"},
        {"role": "user", "content": "No."},
    ]
    rerendered = chatml_tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert rerendered[: len(seen_at_turn_2)] != seen_at_turn_2  # re-rendering would have changed history


def test_tokenizer_without_template_or_pad_is_rejected_with_a_fix():
    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="chat_template"):
        ChatDelta(tok)
    tok = build_tokenizer()
    tok.pad_token = None
    with pytest.raises(ChatTemplateError, match="pad_token"):
        ChatDelta(tok)


QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_renders_the_last_assistant_turn_differently(chatml_tokenizer):
    """Qwen3 adds an empty think block to the last assistant turn only; deltas must not depend on it."""
    chatml_tokenizer.chat_template = QWEN3_LIKE
    try:
        chat = ChatDelta(chatml_tokenizer)
        end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
        delta = chat.user_delta_ids("No.", chat.encode("Is it alive?") + [end])
        assert chatml_tokenizer.decode(delta) == "\n<|im_start|>user\nNo.<|im_end|>\n<|im_start|>assistant\n"
    finally:
        chatml_tokenizer.chat_template = CHATML


def test_template_options_are_validated_with_a_fix(tokenizer):
    with pytest.raises(ChatTemplateError, match="must be a dict"):
        ChatDelta(tokenizer, template_kwargs=["enable_thinking"])
    with pytest.raises(ChatTemplateError, match="add_generation_prompt"):
        ChatDelta(tokenizer, template_kwargs={"add_generation_prompt": False})
    with pytest.raises(ChatTemplateError, match="list of JSON-schema dicts"):
        ChatDelta(tokenizer, tools="guess(n)")
    assert ChatDelta(tokenizer, template_kwargs={"tools": [{"type": "function"}]}).tools == [{"type": "function"}]


def test_tools_given_both_as_argument_and_in_template_kwargs_are_rejected(tokenizer):
    """One list must not silently win over the other: the error says where to give them."""
    with pytest.raises(ChatTemplateError, match=r"tools were given twice.*_tools\(\)"):
        ChatDelta(tokenizer, template_kwargs={"tools": [{"type": "function"}]}, tools=[{"type": "function"}])


def test_a_model_specific_stop_counts_only_when_the_agent_says_it_stopped(chatml_tokenizer):
    """A special id outside the template's end tokens (e.g. one of generation_config.eos_token_id) ends a turn
    when the agent reports stopping on it; a budget cut that happens to end on a special id does not."""
    chat = ChatDelta(chatml_tokenizer)
    start = chatml_tokenizer.convert_tokens_to_ids("<|im_start|>")
    ids = chat.encode("hi") + [start]
    assert chat.turn_ended(ids, stopped=True) and not chat.turn_ended(ids, stopped=False)
    delta = chat.user_delta_ids("No.", ids, ended=True)
    assert chatml_tokenizer.decode(delta) == "\n<|im_start|>user\nNo.<|im_end|>\n<|im_start|>assistant\n"
