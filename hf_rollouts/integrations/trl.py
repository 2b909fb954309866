"""Train any hf_rollouts environment with TRL's ``GRPOTrainer`` (``rollout_func=...``), trl >= 1.16.

Fifteen lines (see the README section "Training with TRL")::

    from trl import GRPOConfig, GRPOTrainer
    from hf_rollouts.integrations.trl import env_reward, make_rollout_func, to_trl_dataset

    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=GRPOConfig(...),
        train_dataset=to_trl_dataset(env.get_train_dataset(256)),
        reward_funcs=[env_reward], rollout_func=make_rollout_func(max_new_tokens=32),
    )
    trainer.train()

How it fits TRL (facts read from trl 1.16's ``grpo_trainer.py``):

* :func:`to_trl_dataset` adds a string ``prompt`` column that *is* the task row (JSON, with the
  row index, so identical tasks still get distinct prompts). TRL hands the rollout function the
  raw prompts of its generation batch, each already repeated ``num_generations`` times.
* The rollout function plays **one complete episode per received prompt**, all of them at once
  through :func:`hf_rollouts.rollout.run_episodes`, and returns one row per prompt:
  ``prompt_ids`` (the episode's first prompt), ``completion_ids`` (everything after it, agent and
  env tokens), ``logprobs`` (``log_softmax(logits / args.temperature)`` of each agent token, 0 on
  env tokens: the quantity TRL recomputes), ``env_mask`` (1 on agent tokens, which alone get
  loss), and the fields ``env_final_reward``, ``env_status``, ``env_error``, ``env_num_turns`` and
  ``env_messages`` and ``env_session_id``, which TRL passes to reward functions as keyword arguments.
* :func:`env_reward` returns the env's final reward, and ``None`` for ``error`` episodes (TRL then
  leaves them out of the group baseline and gives them no advantage, instead of a fake 0).

Pitfalls and how they are handled:

1. ``GRPOConfig`` defaults to ``gradient_checkpointing=True`` and ``bf16=True``, and TRL calls the
   rollout function with the model in train mode. In train mode a checkpointed model drops its KV
   cache, so continuing a kept cache would sample from a wrong context. Generation therefore runs
   inside TRL's ``unwrap_model_for_generation`` (which also lifts checkpointing and gathers
   ZeRO-3 weights), with every module in eval mode, under ``torch.no_grad`` and with autocast
   off; each module's mode is restored afterwards. Nothing else about the model is changed: its
   ``generation_config`` is left alone (the sampling config sets every scalar sampling knob
   explicitly), it is not moved, and the global seed is not reset (sampling draws from torch's
   global generator, which TRL seeds with ``args.seed``).
2. A completion must never be empty (TRL reads its last id). An episode with no agent turn (an
   error before the first turn, or a token budget spent by the first prompt) gets one pad token
   with ``env_mask`` 0, so it contributes no loss.
3. ``mask_truncated_completions`` counts a completion whose last id is not eos/pad as truncated.
   Rows end exactly where the episode ended: with the agent's end-of-turn token when its last turn
   finished, otherwise with a cut answer or an env message. So TRL's "truncated" means "the model's
   last answer was cut, or the episode ran out of tokens", which is what that flag is for. (The
   chat template's end-of-turn token must be one of TRL's eos ids; ``env_status`` tells the rest.)
4. ``max_completion_length`` is not applied to rollout output. Bound episodes with
   ``max_new_tokens`` (per agent turn) and the env's ``max_turns`` / ``max_episode_tokens``.
5. The ``completions`` text TRL decodes includes env text. Score with :func:`env_reward` or read
   ``env_messages``; a text reward function must not treat ``completions`` as the model's answer.

With ``use_vllm`` (server mode) the agent turns are sampled by TRL's vLLM client,
``trainer.vllm_generation.vllm_client`` (TRL syncs the weights before each call). Start the server
with ``--logprobs-mode processed_logprobs`` so the returned log-probabilities use the temperature.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from datasets import Dataset
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..agents.base import Agent
from ..agents.hf.agent import _SAMPLING_FIELDS
from ..agents.hf.backends import generate_padded
from ..agents.hf.kv_cache import KVState, kv_reuse_unsafe_reason, reusable_rows
from ..chat import ChatDelta
from ..envs.base import MultistepEnv
from ..envs.registry import validate_tasks
from ..rollout import episode_jobs, run_episodes
from ..schema import TASK_COLUMNS, TaskValidationError, to_task_dataset
from ..types import Action, AgentRequest

logger = logging.getLogger(__name__)

PROMPT_KEY = "hf_rollouts_task"
"""Key of the row index inside a :func:`to_trl_dataset` prompt."""
EXTRA_FIELDS = ("env_final_reward", "env_status", "env_error", "env_num_turns", "env_messages", "env_session_id")
"""Per-row fields the rollout function returns besides TRL's; reward functions get them as kwargs."""


# --------------------------------------------------------------------------- dataset


def to_trl_dataset(
    tasks: Dataset, *, allowed_env_modules: tuple[str, ...] = (), allowed_env_models: tuple[str, ...] = ()
) -> Dataset:
    """``tasks`` plus a ``prompt`` column for ``GRPOTrainer``: the task row as JSON, with its index.

    Every row's prompt is distinct (the index is part of it), even for identical task data, and
    the rollout function rebuilds the task row from the prompt alone, so the same function serves
    train and eval datasets. The rows are checked first (:func:`~hf_rollouts.envs.registry.validate_tasks`,
    errors name the row and field); pass the same ``allowed_env_*`` as to :func:`make_rollout_func`.
    """
    if "prompt" in tasks.column_names:
        raise TaskValidationError(
            "the task dataset already has a 'prompt' column; to_trl_dataset adds its own. Remove or rename it "
            "(tasks.remove_columns('prompt'))."
        )
    validate_tasks(tasks, allowed_env_modules, allowed_env_models)
    rows = tasks.select_columns(list(TASK_COLUMNS))
    prompts = [
        json.dumps({PROMPT_KEY: i, **{c: row[c] for c in TASK_COLUMNS}}, sort_keys=True) for i, row in enumerate(rows)
    ]
    return tasks.add_column("prompt", prompts)


def task_from_prompt(prompt: Any, where: str = "prompt") -> tuple[int, dict[str, Any]]:
    """``(row index, task row)`` encoded in a :func:`to_trl_dataset` prompt; a clear error otherwise."""
    try:
        data = json.loads(prompt) if isinstance(prompt, str) else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or PROMPT_KEY not in data or any(c not in data for c in TASK_COLUMNS):
        raise TaskValidationError(
            f"{where} is not a task prompt from hf_rollouts.integrations.trl.to_trl_dataset: {str(prompt)[:120]!r}. "
            "Build the trainer's dataset with to_trl_dataset(tasks)."
        )
    return int(data[PROMPT_KEY]), {c: data[c] for c in TASK_COLUMNS}


# --------------------------------------------------------------------------- agents


@dataclass(frozen=True)
class TRLSampling:
    """How agent turns are sampled; read from ``trainer.args`` except ``max_new_tokens``."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    max_new_tokens: int

    @classmethod
    def from_args(cls, args: Any, max_new_tokens: int) -> TRLSampling:
        return cls(
            temperature=float(args.temperature),
            top_p=float(args.top_p if args.top_p is not None else 1.0),
            top_k=int(args.top_k or 0),
            min_p=float(args.min_p or 0.0),
            repetition_penalty=float(args.repetition_penalty or 1.0),
            max_new_tokens=max_new_tokens,
        )


class _TokenAgent(Agent):
    """Shared by the two samplers: token-level requests only, answers cut after the first stop id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling) -> None:
        self.tokenizer, self.sampling = tokenizer, sampling
        self.stop_ids = list(ChatDelta(tokenizer).stop_token_ids)

    def get_action(self, messages, agent_state=None):  # pragma: no cover - the engine always calls act
        raise NotImplementedError(f"{type(self).__name__} answers token-level requests only (act / act_batch).")

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def _stop_len(self, ids: list[int]) -> int:
        return next((i + 1 for i, t in enumerate(ids) if t in self.stop_ids), len(ids))

    def _action(self, ids: list[int], logprobs: list[float]) -> Action:
        n = self._stop_len(ids)
        ids, logprobs = ids[:n], logprobs[:n]
        stopped = n > 0 and ids[-1] in self.stop_ids
        return Action(self.tokenizer.decode(ids, skip_special_tokens=True), ids, logprobs, stopped)


class TrainerPolicyAgent(_TokenAgent):
    """Samples agent turns with a live (training) model, token-in/token-out.

    Unlike :class:`~hf_rollouts.agents.hf.TransformersAgent` it never touches the model: no
    ``generation_config`` replacement, no ``.to()``, no mode change, no global seed. The caller puts
    the model in eval mode (see :func:`_generation_mode`). Log-probabilities are
    ``log_softmax(logits / temperature)`` of the raw logits, TRL's convention. The batched KV cache
    is kept between turns only in eval mode and when reuse is exact for the architecture.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling) -> None:
        super().__init__(tokenizer, sampling)
        self.model = model
        self.reuse_kv = not model.training and kv_reuse_unsafe_reason(model) is None
        self._kv: KVState | None = None
        self.kv_reused_calls = 0
        s = sampling
        greedy = s.temperature == 0
        # Every scalar knob is set explicitly: generate() fills unset ones from model.generation_config,
        # which would add logits processors the stored log-probabilities do not describe.
        self.config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else s.top_k,
            min_p=s.min_p or None,
            repetition_penalty=s.repetition_penalty,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        own = set(self.config.to_diff_dict())
        leftover = sorted(k for k in model.generation_config.to_diff_dict() if k in _SAMPLING_FIELDS and k not in own)
        if leftover:
            logger.warning("the model's generation_config sets %s, which also shape sampling in rollouts.", leftover)

    def episodes_done(self) -> None:
        self._kv = None

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        rows = reusable_rows(self._kv, requests) if self.reuse_kv else None
        self.kv_reused_calls += rows is not None
        kv, self._kv = self._kv, None  # a failed call must not leave a half-updated cache behind
        with torch.autocast(self.model.device.type, enabled=False):
            sampled, self._kv = generate_padded(
                self.model,
                requests,
                self.config,
                temperature=self.sampling.temperature,
                pad_id=self.tokenizer.pad_token_id,
                kv=kv,
                rows=rows,
                keep_kv=self.reuse_kv,
                stop_len=self._stop_len,
            )
        return [(self._action(ids, lps), r.agent_state) for r, (ids, lps) in zip(requests, sampled)]


class VLLMServerAgent(_TokenAgent):
    """Samples agent turns with TRL's vLLM server client (``VLLMClient.generate`` on token ids)."""

    def __init__(self, client: Any, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling) -> None:
        super().__init__(tokenizer, sampling)
        self.client = client

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        s = self.sampling
        out = self.client.generate(
            prompts=[list(r.prompt_token_ids) for r in requests],
            n=1,
            repetition_penalty=s.repetition_penalty,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            max_tokens=s.max_new_tokens,
            logprobs=0,
            generation_kwargs={"stop_token_ids": self.stop_ids},
        )
        ids_list, lps_list = out["completion_ids"], out["logprobs"]
        if len(ids_list) != len(requests):
            raise RuntimeError(f"the vLLM server returned {len(ids_list)} completions for {len(requests)} prompts.")
        actions = []
        for r, ids, lps in zip(requests, ids_list, lps_list):
            # logprobs are [token][k]; with logprobs=0 the sampled token's is the only entry
            flat = [float("nan") if lp[0] is None else float(lp[0]) for lp in lps]
            actions.append((self._action(list(ids), flat), r.agent_state))
        return actions


@contextlib.contextmanager
def _generation_mode(trainer: Any):
    """The trainer's model, unwrapped for generation (TRL's own context), every module in eval mode,
    gradients off; each module's training flag is restored on exit."""
    from trl.models import unwrap_model_for_generation

    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
        gradient_checkpointing_kwargs=getattr(trainer.args, "gradient_checkpointing_kwargs", None),
    ) as model:
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                yield model
        finally:
            for m, training in modes:
                m.training = training


# --------------------------------------------------------------------------- rollout function


@dataclass
class TRLRolloutOptions:
    """Options of :func:`make_rollout_func` (keyword arguments)."""

    allowed_env_modules: tuple[str, ...] = field(
        default=(), metadata={"help": "Module prefixes besides hf_rollouts.envs whose env classes rows may name."}
    )
    allowed_env_models: tuple[str, ...] = field(
        default=(), metadata={"help": "Model/endpoint specs rows may name in an env's model_config_keys."}
    )
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})
    step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds per env hook call; default for env_config['step_timeout']."}
    )
    episode_timeout: float | None = field(
        default=None, metadata={"help": "Seconds per episode; default for env_config['episode_timeout']."}
    )
    max_concurrency: int | None = field(default=None, metadata={"help": "Cap on episodes alive at once."})

    def __post_init__(self) -> None:
        self.allowed_env_modules = tuple(self.allowed_env_modules)
        self.allowed_env_models = tuple(self.allowed_env_models)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        for name in ("step_timeout", "episode_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}.")


class RolloutFunc:
    """``rollout_func(prompts, trainer)`` for ``GRPOTrainer``; see the module docstring.

    ``calls`` counts calls; ``last_episodes`` holds the last call's unpadded episode dicts (one per
    prompt, in order) and ``last_agent`` the agent that played them, for inspection.
    """

    def __init__(self, options: TRLRolloutOptions) -> None:
        self.options = options
        self.calls = 0
        self.last_episodes: list[dict[str, Any]] = []
        self.last_agent: Agent | None = None
        self._envs: dict[tuple[int, str, str], MultistepEnv] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        self.calls += 1
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        sampling = TRLSampling.from_args(trainer.args, self.options.max_new_tokens)
        jobs = []
        for i, prompt in enumerate(prompts):  # one episode per entry: TRL already repeated each prompt G times
            row, task = task_from_prompt(prompt, f"prompt {i}")
            env = self._env(tokenizer, task, f"prompt {i} (task row {row})")
            jobs += episode_jobs(env, [task["task_data"]], 1, prefix=f"trl-call{self.calls}/prompt{i}/", start=i)
        if getattr(trainer.args, "use_vllm", False):
            self.last_agent = VLLMServerAgent(_vllm_client(trainer), tokenizer, sampling)
            episodes = run_episodes(jobs, self.last_agent, **self._run_kw)
        else:
            with _generation_mode(trainer) as model:
                self.last_agent = TrainerPolicyAgent(model, tokenizer, sampling)
                episodes = run_episodes(jobs, self.last_agent, **self._run_kw)
        self.last_episodes = episodes
        pad = tokenizer.pad_token_id
        rows = [{**episode_to_trl_row(ep, pad), "env_session_id": job.session_id} for ep, job in zip(episodes, jobs)]
        keys = ("prompt_ids", "completion_ids", "logprobs", "env_mask", *EXTRA_FIELDS)
        return {key: [r[key] for r in rows] for key in keys}

    @property
    def _run_kw(self) -> dict[str, Any]:
        o = self.options
        return {
            "max_concurrency": o.max_concurrency,
            "on_error": "record",
            "step_timeout": o.step_timeout,  # env_config's own limits win (see hf_rollouts.rollout.scheduler)
            "episode_timeout": o.episode_timeout,
        }

    def _env(self, tokenizer: PreTrainedTokenizerBase, task: dict[str, Any], where: str) -> MultistepEnv:
        config = task["env_config"]
        key = (id(tokenizer), task["env_class_path"], json.dumps(config, sort_keys=True, default=str))
        if key not in self._envs:
            try:
                classes = validate_tasks(
                    to_task_dataset([{**task, "env_config": config}]),
                    self.options.allowed_env_modules,
                    self.options.allowed_env_models,
                )
            except TaskValidationError as exc:
                raise TaskValidationError(f"{where}: {exc}") from exc
            self._envs[key] = classes[task["env_class_path"]](tokenizer, config)
        return self._envs[key]


def _vllm_client(trainer: Any) -> Any:
    generation = getattr(trainer, "vllm_generation", None)
    mode = getattr(generation, "mode", None)
    if mode != "server":
        raise NotImplementedError(
            f"make_rollout_func supports use_vllm with vllm_mode='server' only (got {mode!r}). "
            "Start `trl vllm-serve` and set GRPOConfig(use_vllm=True, vllm_mode='server')."
        )
    client = getattr(generation, "vllm_client", None)
    if client is None:  # TRL keeps the client on the main process only; other processes post to the same server
        from trl.generation.vllm_client import VLLMClient

        base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
        client = generation.vllm_client = VLLMClient(base_url=base_url, connection_timeout=generation.server_timeout)
    return client


def episode_to_trl_row(episode: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """One rollout-function row from an unpadded episode dict (see the module docstring)."""
    ids, mask = list(episode["full_token_ids"]), list(episode["agent_token_mask"])
    logprobs = episode["logprobs"]
    if logprobs is None:  # an agent that reports none: NaN on agent tokens (TRL ignores NaN), 0 elsewhere
        logprobs = [math.nan if m else 0.0 for m in mask]
    turns = episode["turns"]
    start = turns[0].start if turns else len(ids)
    completion, env_mask, lps = ids[start:], mask[start:], [float(x) for x in logprobs[start:]]
    if not completion:  # TRL reads completion_ids[-1]: one pad token, never trained on
        completion, env_mask, lps = [pad_id], [0], [0.0]
    return {
        "prompt_ids": ids[:start] or [pad_id],
        "completion_ids": completion,
        "logprobs": lps,
        "env_mask": env_mask,
        "env_final_reward": float(episode["final_reward"]),
        "env_status": episode["status"],
        "env_error": episode["error"],
        "env_num_turns": int(episode["num_turns"]),
        "env_messages": episode["messages"],
    }


def make_rollout_func(**options: Any) -> RolloutFunc:
    """A ``rollout_func(prompts, trainer)`` for ``GRPOTrainer``; options are :class:`TRLRolloutOptions`.

    Sampling (temperature, top_p, top_k, min_p, repetition_penalty) comes from ``trainer.args``.
    Time limits (``step_timeout``, ``episode_timeout``) are the engine's defaults: a row's own
    ``env_config`` limits win (see :mod:`hf_rollouts.rollout.scheduler`).
    """
    known = {f.name for f in fields(TRLRolloutOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"make_rollout_func got unknown option(s) {unknown}; known: {sorted(known)}.")
    return RolloutFunc(TRLRolloutOptions(**options))


# --------------------------------------------------------------------------- reward


def env_reward(
    prompts: list[Any],
    completions: list[Any],
    env_final_reward: list[float] | None = None,
    env_status: list[str] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Reward function for ``reward_funcs=[env_reward]``: each episode's env reward, ``None`` for ``error``.

    TRL turns ``None`` into NaN: the row is left out of its group's mean/std and gets advantage 0.
    """
    if env_final_reward is None or env_status is None:
        raise TypeError(
            "env_reward needs the env_final_reward and env_status fields that hf_rollouts' rollout function returns; "
            "pass rollout_func=make_rollout_func(...) to GRPOTrainer."
        )
    return [
        None if status == "error" or not math.isfinite(reward) else float(reward)
        for reward, status in zip(env_final_reward, env_status)
    ]
