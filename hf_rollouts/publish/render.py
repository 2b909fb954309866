"""Readable views of a stored trajectory (what ``hf-rollouts inspect`` prints).

Agent-sampled spans are wrapped in ``[[`` … ``]]``; a non-zero per-token reward
is shown as ``{+1}`` right after its token. Environment text is printed as
stored (chat-template markers included), so what you read is exactly the token
sequence a trainer sees, decoded.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedTokenizerBase

AGENT_OPEN, AGENT_CLOSE = "[[", "]]"


def format_trajectory(row: dict[str, Any], rollout: int, tokenizer: PreTrainedTokenizerBase | None) -> str:
    """Render rollout ``rollout`` of a rollout-dataset ``row``."""
    lines = [
        f"env: {row['env_class_path']}",
        f"env_config: {row['env_config']}",
        f"task_data: {row['task_data']}",
        f"rollout {rollout} of {len(row['final_rewards'])}: status={row['statuses'][rollout]}"
        f" final_reward={row['final_rewards'][rollout]:.4g} turns={row['num_turns'][rollout]}",
    ]
    if row["errors"][rollout]:
        lines.append(f"error: {row['errors'][rollout]}")
    ids = row["padded_full_token_ids"][rollout]
    attn = row["padded_full_attention_mask"][rollout]
    mask = row["padded_agent_token_mask"][rollout]
    rewards = row["padded_per_token_rewards"][rollout]
    length = sum(attn)
    lines.append(f"tokens: {length} ({sum(mask)} from the agent, {len(ids) - length} padding)")
    sampled = row.get("padded_sampled_token_mask")
    if sampled is not None and sampled[rollout] is not None:
        retokenized = sum(mask) - sum(sampled[rollout])
        if retokenized:
            lines.append(f"agent tokens re-tokenized from text (no sampled ids reported): {retokenized}")
    if tokenizer is None:
        lines.append("(no tokenizer found: showing the readable conversation instead of tokens)")
        for m in row["conversations"][rollout]:
            lines.append(f"--- {m['role']}\n{m['content']}")
        return "\n".join(lines)
    lines.append("--- trajectory (agent tokens in [[ ]], per-token rewards in { })")
    text, i = [], 0
    while i < length:
        j = i
        while j < length and mask[j] == mask[i]:
            j += 1
        if mask[i]:
            pieces = []
            start = i
            for k in range(i, j):
                if rewards[k] != 0.0:
                    pieces.append(tokenizer.decode(ids[start : k + 1]) + f"{{{rewards[k]:+g}}}")
                    start = k + 1
            pieces.append(tokenizer.decode(ids[start:j]))
            text.append(AGENT_OPEN + "".join(pieces) + AGENT_CLOSE)
        else:
            text.append(tokenizer.decode(ids[i:j]))
        i = j
    lines.append("".join(text))
    nonzero = [(k, r) for k, r in enumerate(rewards) if r != 0.0]
    lines.append(f"--- per-token rewards (position: reward): {nonzero if nonzero else 'all zero'}")
    logprobs = row.get("padded_logprobs")
    if logprobs and logprobs[rollout] is not None:
        agent_lp = [lp for lp, m in zip(logprobs[rollout], mask) if m and not math.isnan(lp)]
        if agent_lp:
            lines.append(f"mean sampling log-prob of agent tokens: {sum(agent_lp) / len(agent_lp):.3f}")
    return "\n".join(lines)
