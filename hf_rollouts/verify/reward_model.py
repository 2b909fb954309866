"""``reward_model``: a transformers sequence-classification reward model as a verifier, scored as TRL scores it.

TRL's ``GRPOTrainer`` (1.16) takes a reward model in ``reward_funcs`` (an id or path is loaded with
``AutoModelForSequenceClassification.from_pretrained(id, num_labels=1)``) and ``_calculate_rewards`` scores each
completion so:

* conversational prompts (a list of messages): the text is ``tokenizer.apply_chat_template(prompt + completion,
  tokenize=False)`` with the **reward model's** tokenizer (``chat_template_kwargs`` passed on); standard prompts: the
  text is ``prompt + completion``;
* the texts are tokenized with ``add_special_tokens=False``, padded **on the right**, no truncation, and the reward
  is ``model(**inputs).logits[:, 0]``, which transformers reads at each row's last token that is not the pad id
  (TRL sets ``config.pad_token_id`` to the tokenizer's, the eos token when it has no pad token).

:class:`RewardModel` does the same for one reply: the conversation is the task's prompt (a string becomes one user
message; ``conversational=False`` keeps TRL's plain ``prompt + reply`` text instead) and the reply as the assistant's
message. Calls of many episodes awaited together are one forward pass (:class:`~.batcher.MicroBatcher`, at most
``batch_size`` rows), padded on the right whatever the tokenizer's ``padding_side``, so a reply's score does not
depend on its batch (up to float rounding). An input longer than ``max_length`` (default: the model's
``max_position_embeddings``) is cut, from the left by default (the end, where the score is read, is kept), and the
verdict says so; TRL would pass it whole.

The model loads on first use, on the device accelerate gives the process
(:func:`hf_rollouts.distributed.process_state`), once per process for each set of options. The reward is the raw
score; the verdict's ``info`` has ``score`` and ``input_tokens`` (and ``truncated_from`` when cut). Full marks: a
score at or above ``threshold``. Without a threshold a raw score has no full marks: the reward is kept, the verdict's
reason says no bar was set, so it never counts as ``solved`` (nor stops retries as a pass would). The model is named
in ``env_config``, so a task row may only name it when the caller allows it (``allowed_env_models``, CLI
``--allow-env-model``): :meth:`RewardModel.models_named`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Verdict, Verifier, VerifierConfigError, register_verifier
from .batcher import MicroBatcher
from .checks import show_number

_LOADED: dict[str, tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def load_reward_model(model: str, tokenizer: str | None = None, dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a reward model id or path, as TRL loads it (``num_labels=1``; the tokenizer's pad token
    is its eos token when it has none, and the model's ``pad_token_id`` is the tokenizer's), in eval mode on the
    process's device; loaded once per process."""
    key = json.dumps([model, tokenizer, dtype])
    with _LOCK:
        if key not in _LOADED:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            from ..distributed import process_state

            net = AutoModelForSequenceClassification.from_pretrained(
                model, num_labels=1, dtype=getattr(torch, dtype) if dtype != "auto" else "auto"
            )
            tok = AutoTokenizer.from_pretrained(tokenizer or model)
            _LOADED[key] = prepare(net, tok)
            _LOADED[key][0].to(process_state().device)
        return _LOADED[key]


def prepare(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """What TRL's ``GRPOTrainer.__init__`` does to a reward model and its tokenizer: a pad token (the eos token when
    there is none) and the model's ``pad_token_id`` set to it; eval mode."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def render(tokenizer: Any, prompt: Any, reply: str, conversational: bool = True, **template_kwargs: Any) -> str:
    """The text TRL's ``_calculate_rewards`` scores for ``reply`` to ``prompt`` (see the module docstring)."""
    if isinstance(prompt, str) and conversational:
        prompt = [{"role": "user", "content": prompt}]
    if isinstance(prompt, str):
        return prompt + reply
    messages = [*prompt, {"role": "assistant", "content": reply}]
    return tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)


def score_texts(
    model: Any, tokenizer: Any, texts: Sequence[str], max_length: int | None = None, truncation_side: str = "left"
) -> list[tuple[float, int, int]]:
    """One forward pass over ``texts``: per text ``(score, tokens scored, tokens before truncation)``. Right
    padding with the pad id, ``add_special_tokens=False``, the score is ``logits[:, 0]`` (as TRL)."""
    import torch

    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    full = [len(x) for x in ids]
    if max_length is not None:
        ids = [x[-max_length:] if truncation_side == "left" else x[:max_length] for x in ids]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=model.device)
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=model.device)
    with torch.inference_mode():
        scores = model(input_ids=input_ids, attention_mask=mask).logits[:, 0].float().tolist()
    return [(s, len(x), n) for s, x, n in zip(scores, ids, full)]


@register_verifier("reward_model")
class RewardModel(Verifier):
    """A reward model's score of the reply (see the module docstring). ``model``: an id or a local path (or, in
    Python, a loaded ``...ForSequenceClassification`` model with ``tokenizer`` given as an object)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        conversational: bool = True,
        threshold: float | None = None,
        max_length: int | None = None,
        truncation_side: str = "left",
        batch_size: int = 32,
        dtype: str = "float32",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) and (tokenizer is None or isinstance(tokenizer, str)):
            raise VerifierConfigError("tokenizer", "reward_model: a loaded model needs its tokenizer object too.")
        if isinstance(model, str) and not model.strip():
            raise VerifierConfigError("model", "reward_model: 'model' is an id or a path, got an empty string.")
        if truncation_side not in ("left", "right"):
            raise VerifierConfigError(
                "truncation_side", f"truncation_side is 'left' or 'right', got {truncation_side!r}."
            )
        if max_length is not None and max_length < 1:
            raise VerifierConfigError("max_length", f"reward_model: max_length must be >= 1, got {max_length}.")
        if batch_size < 1:
            raise VerifierConfigError("batch_size", f"reward_model: batch_size must be >= 1, got {batch_size}.")
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise VerifierConfigError("dtype", f"dtype is float32, bfloat16, float16 or auto, got {dtype!r}.")
        self.model, self.tokenizer, self.conversational, self.threshold = model, tokenizer, conversational, threshold
        self.max_length, self.truncation_side, self.batch_size, self.dtype = (
            max_length,
            truncation_side,
            batch_size,
            dtype,
        )
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._loaded: tuple[Any, Any] | None = None if isinstance(model, str) else prepare(model, tokenizer)
        self._batcher = MicroBatcher(self._score_batch, batch_size)

    @classmethod
    def models_named(cls, options: Mapping[str, Any]) -> list[str]:
        """The model (and tokenizer) the spec loads: trusted only when the caller allows them."""
        return [v for v in (options.get("model"), options.get("tokenizer")) if v is not None]

    def loaded(self) -> tuple[Any, Any]:
        """``(model, tokenizer)``, loaded on first use (:func:`load_reward_model`)."""
        if self._loaded is None:
            self._loaded = load_reward_model(self.model, self.tokenizer, self.dtype)
        return self._loaded

    def options(self) -> dict[str, Any]:
        model, _ = self.loaded()
        name = self.model if isinstance(self.model, str) else model.config.name_or_path
        return {
            "model": name,
            "weights": weights_digest(model),
            "tokenizer": self.tokenizer if isinstance(self.tokenizer, str) or self.tokenizer is None else "object",
            "conversational": self.conversational,
            "threshold": self.threshold,
            "max_length": self.max_length,
            "truncation_side": self.truncation_side,
            "dtype": self.dtype,
            "chat_template_kwargs": self.chat_template_kwargs,
        }

    def text(self, reply: str, task: Mapping[str, Any]) -> str:
        """The text scored for ``reply`` to ``task["prompt"]`` (TRL's rendering, the reward model's template)."""
        _, tokenizer = self.loaded()
        return render(tokenizer, task.get("prompt", ""), reply, self.conversational, **self.chat_template_kwargs)

    def _score_batch(self, items: list[tuple[str, Mapping[str, Any]]]) -> list[tuple[float, int, int]]:
        """On a worker thread: load (first time), render, one forward pass."""
        model, tokenizer = self.loaded()
        limit = self.max_length or getattr(model.config.get_text_config(), "max_position_embeddings", None)
        texts = [self.text(reply, task) for reply, task in items]
        return score_texts(model, tokenizer, texts, limit, self.truncation_side)

    def verdict(self, scored: tuple[float, int, int]) -> Verdict:
        score, tokens, full = scored
        info: dict[str, Any] = {"score": score, "input_tokens": tokens}
        if full != tokens:
            info["truncated_from"] = full
        if self.threshold is None:
            return Verdict(
                score,
                f"reward model score {show_number(score)} (no threshold set: a raw score is never full marks)",
                info,
            )
        if score < self.threshold:
            return Verdict(
                score,
                f"reward model score {show_number(score)} is below the threshold {show_number(self.threshold)}",
                info,
            )
        return Verdict(score, None, info)

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        return self.verdict(self._score_batch([(reply, task)])[0])

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """Batched with every other reply awaited on the loop at the same time; the forward pass runs on a worker
        thread."""
        return self.verdict(await self._batcher((reply, task)))


def weights_digest(model: Any, probes: int = 256) -> str:
    """A short hash of the model's weights (``probes`` values of each tensor, strided), for the rollout cache key:
    other weights under the same name are another verifier."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // probes)][:probes].float().cpu()
            digest.update(name.encode() + sample.numpy().tobytes())
    return digest.hexdigest()[:16]


__all__ = ["RewardModel", "load_reward_model", "prepare", "render", "score_texts", "weights_digest"]
