"""Token-exact multi-turn conversations built by appending deltas.

Re-rendering the whole conversation with the chat template every turn is the
most reported bug family in RL rollout code: templates that are not
prefix-preserving (Qwen3 drops past ``<think>`` blocks, Mistral moves the system
prompt, some add BOS each render) silently change the ids the model already saw,
so the stored sequence no longer matches what was sampled. :class:`ChatDelta`
never does that. The first prompt is rendered once; after that, each turn appends
the agent's ids and then a *delta*: the template applied to a fixed dummy context
plus the new message, minus the dummy context's own rendering. The delta renders
and tokenizes a constant-size text, so tokenization work grows linearly with
the episode, not with turns × history.

The rules, all read as "what would the model have seen, given that it sampled these ids":

1. **Agent ids are stored unchanged.** A token-level agent's ids (analysis channel,
   reasoning, tool call, whatever it sampled) are never re-tokenized or edited.
2. **After a sampled end token, append only what the template writes after that
   turn's end marker**, whichever end token the model chose. The *end marker* of a
   past assistant turn is the optional whitespace plus the first special token that
   follows its content in the template (``<|im_end|>``, ``<|eot_id|>``, gpt-oss's
   ``<|end|>``, Llama-2's ``" </s>"``). So gpt-oss ``…<|return|>`` continues
   ``<|start|>user…`` (never ``<|return|><|end|>``), Llama-3 ``…<|eom_id|>`` continues
   ``<|start_header_id|>user…``, Gemma ``…<eos>`` continues ``\\n<start_of_turn>user``,
   and Llama-2 ``…</s>`` continues ``<s>[INST]…`` (no second ``" </s>"``).
3. **A turn cut by the token budget** (no end token sampled) gets the template's
   whole closing, end marker included, as environment tokens.
4. **A text-only agent's turn** is stored as the ids a model would have sampled to
   say that text: the template's *opening* of a past assistant turn (the text it
   writes between the generation prompt and the content: gpt-oss
   ``<|channel|>final<|message|>``, Llama-2 ``" "``, empty for most), the text, and
   the template's *end token* (the first special token closing an assistant turn
   that is the last message: ``<|im_end|>``, gpt-oss ``<|return|>``). All of it is agent
   tokens (not sampled ones), so a trainer also learns to emit the end token.
5. **Environment text is data, never control.** Special-token strings inside env
   messages and the system prompt (``<|end|><|assistant|>``) are tokenized as plain
   text, so an env cannot forge a turn; the template's own framing keeps its special
   ids. (Agent text from text-only agents is tokenized normally.) "Special" is every
   added token marked ``special``, whether or not a special-token list names it
   (real Llama-3.1's ``<|eom_id|>``); the same set tells a model's own stop (rule 2).
6. **Template options**: ``template_kwargs`` (``enable_thinking``, ``reasoning_effort``,
   ``date_string``, ...) go to every render; ``tools`` go to the first render only,
   where every template puts them (system/developer block, first user message, or
   for Mistral the last user message at that time), so they appear once. Renders that
   deltas are cut from get them too where the template needs them (tool-result deltas
   always; every render for a template that raises without them, as Hermes-2-Pro's,
   which loops over them unguarded): the delta is cut after the first prompt, so the
   list still appears once in the stored ids. Tools come
   from an env's ``_tools()`` hook (``ChatDelta(tools=...)``) or from
   ``template_kwargs["tools"]``, never both: giving both raises :class:`ChatTemplateError`
   rather than silently dropping one list.

Where a full re-render of the final conversation differs from the stored ids, the
template rewrites history; :func:`check_chat_template` names the known cases
(dropped reasoning, moved system prompt, end token rewritten, whitespace trimmed)
and flags anything else as a defect.

Tool turns follow the same rules: the model's calls are parsed per family from its sampled ids
(:mod:`~hf_rollouts.chat.tool_calls`) and the results appended as ``tool`` messages rendered by the template
after the sampled end token (:mod:`~hf_rollouts.chat.tool_turns`).

Modules: :mod:`~hf_rollouts.chat.delta` (:class:`ChatDelta`, :class:`AssistantFraming`; rules 1-4, 6),
:mod:`~hf_rollouts.chat.guard` (the special-token guard; rule 5), :mod:`~hf_rollouts.chat.check`
(:func:`check_chat_template`).
"""

from .check import TemplateFinding, TemplateReport, check_chat_template
from .delta import AssistantFraming, ChatDelta, ChatTemplateError
from .tool_calls import ToolFormat, ToolTemplateError
from .tool_turns import ToolTurns, detect_tool_format, template_messages

__all__ = [
    "AssistantFraming",
    "ChatDelta",
    "ChatTemplateError",
    "TemplateFinding",
    "TemplateReport",
    "ToolFormat",
    "ToolTemplateError",
    "ToolTurns",
    "check_chat_template",
    "detect_tool_format",
    "template_messages",
]
