"""A transformers causal LM as an agent, token-in / token-out.

The agent conditions on exactly ``request.prompt_token_ids`` (never on a
re-rendered chat) and reports the ids it sampled with their log-probabilities,
so the environment stores what the model really produced.

Log-probability convention: ``log_softmax(logits / temperature)`` of the sampled
id, before top-p filtering — the quantity a PPO/GRPO trainer recomputes for the
importance ratio. With ``temperature == 0`` (greedy) the logits are not scaled.
The ``continuous`` backend reports transformers' own log-probabilities; at
temperature 1 both backends match a teacher-forced forward pass (tested).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..chat import ChatDelta
from ..distributed import process_state
from ..types import Action, AgentRequest, Message
from .base import Agent

Backend = Literal["generate", "continuous"]
BACKENDS: tuple[str, ...] = ("generate", "continuous")


@dataclass
class SamplingConfig:
    """Sampling settings of a :class:`TransformersAgent`."""

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature; 0 means greedy decoding."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampling RNG (reset by set_seed)."})
    backend: Backend = field(
        default="generate",
        metadata={
            "help": "'generate': left-padded batched model.generate (fastest measured on CPU). "
            "'continuous': transformers continuous batching (generate_batch), for GPUs with many varied-length episodes."
        },
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"Invalid sampling settings temperature={self.temperature}, top_p={self.top_p}, "
                f"max_new_tokens={self.max_new_tokens}: need temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 1."
            )


class TransformersAgent(Agent):
    """Wraps any transformers causal LM and its tokenizer.

    The model is moved to ``device`` (default: accelerate's process device, :func:`~hf_rollouts.distributed.process_state`,
    so under ``accelerate launch`` each process uses its own device).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig | None = None,
        *,
        device: str | torch.device | None = None,
        name: str | None = None,
        **sampling_kwargs: Any,
    ) -> None:
        if sampling is not None and sampling_kwargs:
            raise TypeError("Pass either a SamplingConfig or sampling keyword arguments, not both.")
        self.sampling = sampling or SamplingConfig(**sampling_kwargs)
        self.device = torch.device(device) if device is not None else process_state().device
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.chat = ChatDelta(tokenizer)
        self.stop_ids = list(self.chat.stop_token_ids)
        self.generate_calls = 0
        self.set_seed(self.sampling.seed)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, dtype: str | torch.dtype = "auto", trust_remote_code: bool = False, **kwargs: Any
    ) -> "TransformersAgent":
        """Load a model and tokenizer by hub id or local path (remote code only if you allow it)."""
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, name=name_or_path, **kwargs)

    # -- Agent API ---------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        request = AgentRequest(messages=messages, prompt_token_ids=self.chat.initial_ids(messages), agent_state=agent_state)
        return self._single(request)

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any]]:
        if not requests:
            return []
        prompts = [r.prompt_token_ids for r in requests]
        if self.sampling.backend == "continuous":
            sampled = self._generate_continuous(prompts)
        else:
            sampled = self._generate_padded(prompts)
        out = []
        for request, (ids, logprobs) in zip(requests, sampled):
            ids, logprobs, stopped = self._cut_at_stop(ids, logprobs)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append((Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped), request.agent_state))
        return out

    def fingerprint(self) -> dict[str, Any]:
        return {
            **super().fingerprint(),
            "model": self.name,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "weights_probe": self.weights_probe(),
            "sampling": asdict(self.sampling),
        }

    @torch.no_grad()
    def weights_probe(self) -> str:
        """A cheap hash of a strided sample of every parameter tensor.

        It changes when the weights change (e.g. after an optimizer step in a
        training loop), so the pipeline's cache never serves samples of an older policy.
        """
        import hashlib

        digest = hashlib.sha256()
        for name, p in self.model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 256)][:256].float().cpu()
            digest.update(name.encode())
            digest.update(sample.numpy().tobytes())
        return digest.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "sampling": asdict(self.sampling), "device": str(self.device)}

    # -- generation backends -----------------------------------------------
    def _generation_config(self) -> GenerationConfig:
        s = self.sampling
        greedy = s.temperature == 0
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else 0,  # None would mean transformers' default top_k=50: sampling must match the stored full-softmax log-probs
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )

    @torch.inference_mode()
    def _generate_padded(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """Left-padded batched ``model.generate`` with an explicit attention mask."""
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        self.generate_calls += 1
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            generation_config=self._generation_config(),
        )
        new = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float()  # [batch, new, vocab]
        if self.sampling.temperature > 0:
            logits = logits / self.sampling.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1)).squeeze(-1).cpu()
        return [(new[i].tolist(), logprobs[i].tolist()) for i in range(len(prompts))]

    def _generate_continuous(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """transformers continuous batching; log-probabilities come from the manager."""
        from transformers import ContinuousBatchingConfig

        self.generate_calls += 1
        outputs = self.model.generate_batch(
            inputs=prompts,
            generation_config=self._generation_config(),
            continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
            progress_bar=False,
        )
        results = list(outputs.values())
        by_prompt: dict[int, Any] = {}
        for key, o in outputs.items():
            by_prompt[int(str(key).rsplit("_", 1)[-1])] = o
        ordered = [by_prompt[i] for i in range(len(prompts))] if len(by_prompt) == len(prompts) else results
        for o in ordered:
            if o.error:
                raise RuntimeError(f"continuous batching request {o.request_id} failed: {o.error}")
        return [(list(o.generated_tokens), list(o.logprobs)) for o in ordered]

    def _cut_at_stop(self, ids: list[int], logprobs: list[float]) -> tuple[list[int], list[float], bool]:
        """Keep ids up to and including the first stop id; drop the batch's padding after it."""
        for i, t in enumerate(ids):
            if t in self.stop_ids:
                return ids[: i + 1], logprobs[: i + 1], True
        return ids, logprobs, False
