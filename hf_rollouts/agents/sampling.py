"""One sampling configuration shared by every agent, validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(kw_only=True)
class SamplingConfig:
    """How an agent samples one turn (keyword-only). Every agent reads these fields;
    agent-specific settings (a local backend, an endpoint's URL) live on the agent.

    ``stop``: strings that end a turn, as an end token does (SkyRL-style envs stop on ``</answer>``,
    ``</sql>``). Token-exact: the turn ends with the sampled token whose text completes the first stop
    string, and every sampled id up to and including it is stored as sampled (the token may carry text
    past the stop string; nothing is cut out of a token). The action text the env parses is the decoded
    ids, so it contains the stop string. The template's closing of the turn (``<|im_end|>``, ...), which
    the model did not sample, follows as environment tokens, as after a turn cut by ``max_new_tokens``.
    See :mod:`hf_rollouts.agents.stop_strings`.
    """

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature; 0 means greedy decoding."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    top_k: int = field(
        default=0,
        metadata={"help": "Sample among the k most likely ids only (before top-p); 0 means no limit."},
    )
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})
    stop: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Stop strings: a turn ends with the sampled token that completes one (kept, stored as sampled), "
            "e.g. --stop '</answer>'."
        },
    )

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1 or self.top_k < 0:
            raise ValueError(
                f"Invalid sampling settings temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}, "
                f"max_new_tokens={self.max_new_tokens}: need temperature >= 0, 0 < top_p <= 1, top_k >= 0 (0: off), "
                "max_new_tokens >= 1."
            )
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a list of strings, got the string {self.stop!r}; pass [{self.stop!r}].")
        self.stop = list(self.stop)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}.")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a dict for fingerprints and cards; ``stop`` and ``top_k`` only when set (so runs without
        them keep the cache keys and cards they had before those fields existed)."""
        out = asdict(self)
        for name in ("stop", "top_k"):
            if not out[name]:
                del out[name]
        return out


def sampling_from_kwargs(sampling: SamplingConfig | None, kwargs: dict[str, Any]) -> SamplingConfig:
    """An agent's :class:`SamplingConfig`: ``sampling``, or one built from the ``SamplingConfig`` fields found in the
    agent's keyword arguments ``kwargs`` (they are removed from it; the rest are the agent's own settings). Raises
    ``TypeError`` when both are given."""
    names = {f.name for f in fields(SamplingConfig)}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    if sampling is not None and given:
        raise TypeError("Pass either a SamplingConfig or temperature/top_p/max_new_tokens, not both.")
    return sampling or SamplingConfig(**given)
