"""TRL-style reward functions for tests/test_dataset_env.py: named by import path (``hfr_rewards.NAME``), as a task
row names one, so that the trust rule applies (allowed_env_modules=["hfr_rewards"])."""

from __future__ import annotations


def contains_solution(prompts, completions, solution, difficulty, **kwargs):
    """Standard or conversational: 1.0 * difficulty when the solution's text appears in the completion; ``None`` when
    the row has no difficulty (this function does not score it)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [None if d is None else float(s in t) * d for t, s, d in zip(texts, solution, difficulty)]


def short_completion(prompts, completions, completion_ids, **kwargs):
    """Reads ``completion_ids``: shorter is better."""
    return [1.0 / (1 + len(ids)) for ids in completion_ids]


async def async_says_quarter(prompts, completions, **kwargs):
    """An ``async def`` reward reading both formats: 1.0 when a completion to a question about quarters says
    "quarter"."""
    out = []
    for p, c in zip(prompts, completions):
        prompt = p if isinstance(p, str) else p[-1]["content"]
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(float("1/4" in prompt and "quarter" in text))
    return out


def partial_unless_right(prompts, completions, **kwargs):
    """A partial reward (0.2) for any completion, full marks (1.0) for one that says "right"."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [1.0 if "right" in t else 0.2 for t in texts]


def cannot_score(prompts, completions, **kwargs):
    """Raises, as a reward function with a bug does."""
    raise ValueError(f"cannot score {completions[0]}")


async def async_cannot_score(prompts, completions, **kwargs):
    """Raises from an ``async def`` function."""
    raise KeyError("solution")
