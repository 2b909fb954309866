"""One sampling configuration shared by every agent, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class SamplingConfig:
    """How an agent samples one turn (keyword-only). Every agent reads these three fields;
    agent-specific settings (a local backend, an endpoint's URL) live on the agent."""

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature; 0 means greedy decoding."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"Invalid sampling settings temperature={self.temperature}, top_p={self.top_p}, "
                f"max_new_tokens={self.max_new_tokens}: need temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 1."
            )
