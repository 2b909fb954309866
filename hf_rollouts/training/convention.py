"""Which log-probabilities a rollout dataset stores, and the check that keeps a ratio honest.

hf_rollouts' own agents store ``log_softmax(logits / T)`` at the sampling temperature ``T``.
An inference server may not: vLLM returns ``log_softmax(logits)`` (raw, before temperature)
unless started with ``--logprobs-mode processed_logprobs``. The agent records what its server
returns as ``{"kind": "raw" | "processed", "temperature": T_stored}`` (the stored values are
``log_softmax(logits / T_stored)``); the dataset card keeps it in its YAML metadata under
:data:`hf_rollouts.schema.LOGPROB_CONVENTION_KEY`.

A PPO/GRPO ratio ``exp(new - old)`` is only meaningful when ``new`` is computed the same way as
``old``: :func:`check_logprob_convention` refuses a recomputation at another temperature and
says how to fix it (recompute at ``T_stored``, or regenerate with processed log-probs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..schema import LOGPROB_CONVENTION_KEY


def read_logprob_convention(source: Any) -> dict[str, Any] | None:
    """The convention in the card of ``source`` (a ``save_rollouts`` directory or a Hub dataset id).

    ``None`` when there is no card or it records none (hf_rollouts' own agents:
    ``log_softmax(logits / T)`` at the sampling temperature), or for in-memory datasets.
    """
    if not isinstance(source, (str, Path)):
        return None
    from huggingface_hub import DatasetCard

    path = Path(source)
    readme = path / "README.md" if path.is_dir() else None
    try:
        if readme is not None:
            card = DatasetCard.load(readme) if readme.is_file() else None
        else:
            card = DatasetCard.load(str(source)) if str(source).count("/") == 1 and not path.exists() else None
    except Exception:  # no card reachable (offline, no README): nothing recorded
        return None
    value = card.data.to_dict().get(LOGPROB_CONVENTION_KEY) if card is not None else None
    return value if isinstance(value, dict) else None


def check_logprob_convention(convention: dict[str, Any] | None, temperature: float) -> None:
    """Raise ``ValueError`` if log-probs recomputed at ``temperature`` would not match the stored ones.

    ``convention`` is what :func:`read_logprob_convention` returns (``None``: nothing recorded,
    nothing checked). ``temperature == 0`` (greedy) means unscaled logits, as in the agents.
    """
    if not convention:
        return
    stored = float(convention.get("temperature", 1.0))
    used = temperature if temperature > 0 else 1.0
    if abs(stored - used) > 1e-6:
        kind = convention.get("kind", "?")
        raise ValueError(
            f"The stored log-probs are log_softmax(logits / {stored:g}) ({kind!r} log-probs from the server), but "
            f"they would be compared with log-probs recomputed at temperature={temperature:g}: the ratio would be "
            f"biased. Recompute with temperature={stored:g}, or regenerate the rollouts with processed log-probs "
            "(vLLM: --logprobs-mode processed_logprobs, and the agent's logprobs_mode='processed')."
        )
