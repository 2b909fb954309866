"""Train any hf_rollouts environment with TRL's ``GRPOTrainer`` (``rollout_func=...``), trl >= 1.16.

In one call, :func:`build_grpo_trainer` (``trainer, rollout_func = build_grpo_trainer(model, tokenizer,
env.get_train_dataset(256), learning_rate=3e-5)``). The short version by hand (docs/guides/training.md, "Training
with TRL", has the full one)::

    from trl import GRPOConfig, GRPOTrainer
    from hf_rollouts.integrations.trl import env_reward, make_rollout_func, to_trl_dataset

    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=GRPOConfig(...),
        train_dataset=to_trl_dataset(env.get_train_dataset(256)),
        reward_funcs=[env_reward], rollout_func=make_rollout_func(max_new_tokens=32),
    )
    trainer.train()

Modules: :mod:`.dataset` (the ``prompt`` column), :mod:`.agents` (the samplers and the generation
context), :mod:`.rollout` (the rollout function and the reward), :mod:`.trainer` (the one-call
trainer), :mod:`.async_grpo` and :mod:`.async_weights` (TRL's asynchronous ``AsyncGRPOTrainer`` on our envs:
:func:`build_async_grpo_trainer`; docs/guides/training.md says what it takes on a CPU). ``trl`` itself is imported only
inside the functions that need it, so importing this package does not need trl.

How it fits TRL (facts read from trl 1.16's ``grpo_trainer.py``):

* :func:`to_trl_dataset` adds a string ``prompt`` column that *is* the task row (JSON, with the
  row index, so identical tasks still get distinct prompts). TRL hands the rollout function the
  raw prompts of its generation batch, each already repeated ``num_generations`` times.
* The rollout function plays **one complete episode per received prompt**, all of them at once
  through :func:`hf_rollouts.rollout.play_groups`, and returns one row per prompt:
  ``prompt_ids`` (the episode's first prompt), ``completion_ids`` (everything after it, agent and
  env tokens), ``logprobs`` (``log_softmax(logits / args.temperature)`` of each agent token, 0 on
  env tokens: the quantity TRL recomputes), ``env_mask`` (1 on agent tokens, which alone get
  loss), and the fields ``env_final_reward``, ``env_status``, ``env_error``, ``env_num_turns``,
  ``env_messages``, ``env_info`` (the ``infos`` column's JSON text) and ``env_session_id``, which TRL passes to
  reward functions as keyword arguments.
* A turn ends at the first of: the tokenizer's eos, the chat template's end token, or any id of the
  model's ``generation_config.eos_token_id`` (Llama-3.1 lists ``<|eom_id|>`` there), the union TRL
  itself stops on (plus the template's end token).
* :func:`env_reward` returns the env's final reward, and ``None`` for ``error`` episodes (TRL then
  leaves them out of the group baseline and gives them no advantage, instead of a fake 0).

Pitfalls and how they are handled:

1. ``GRPOConfig`` defaults to ``gradient_checkpointing=True`` and ``bf16=True``, and TRL calls the
   rollout function with the model in train mode. In train mode a checkpointed model drops its KV
   cache, so continuing a kept cache would sample from a wrong context. Generation therefore runs
   inside TRL's ``unwrap_model_for_generation`` (which also lifts checkpointing and gathers
   ZeRO-3 weights), with every module in eval mode. Under bf16/fp16, accelerate has replaced
   ``model.forward`` by an autocast wrapper that TRL's unwrapping keeps; for the call the model's
   own forward (``model._original_forward``) is put back, so sampling and its log-probabilities
   are in the model's dtype. The agent samples under ``torch.inference_mode`` with autocast off in
   the engine's worker thread that makes the batch call, the thread that calls the model (grad and
   autocast modes are per thread). On exit, also after an exception, the model is as TRL had it: each module's mode, the
   accelerate wrapper, and (TRL's context restores them only on a clean exit, so an exception is
   re-raised after it) gradient checkpointing and ZeRO-3 hooks. Nothing else about the model is
   changed: its ``generation_config`` is left alone (the sampling config sets every scalar
   sampling knob explicitly), it is not moved, and the global seed is not reset (sampling draws
   from torch's global generator, which TRL seeds with ``args.seed``).
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
6. A row holds one completion per prompt, so an episode must be one sample
   (:class:`~hf_rollouts.sample.Sample`): :func:`to_trl_dataset` and the rollout function refuse a row whose env
   plays ``template_mode: "render"``, and an episode of several samples (an agent program whose history is not an
   extension) is a ``ValueError`` at its row naming the fix, never trained as its last sample alone.

With ``use_vllm`` (server mode) the agent turns are sampled by TRL's vLLM client,
``trainer.vllm_generation.vllm_client`` (TRL syncs the weights before each call). Start the server
with ``--logprobs-mode processed_logprobs`` so the returned log-probabilities use the temperature. In colocate mode
(``vllm_mode="colocate"``) they are sampled by the trainer's own in-process engine (:mod:`.colocate`); on a CPU,
:func:`reload_weights_sync` (which :func:`build_grpo_trainer` applies) replaces TRL's weight sync, which fails there.
"""

from __future__ import annotations

from .agents import TrainerPolicyAgent, TRLSampling, VLLMColocateAgent, VLLMServerAgent, generation_mode, stop_token_ids
from .async_grpo import EnvRolloutWorker, build_async_grpo_trainer
from .async_weights import CopyWeights, PolicyLock, ServerWeightReload
from .colocate import reload_weights_sync
from .dataset import PROMPT_KEY, task_from_prompt, to_trl_dataset
from .rollout import (
    EXTRA_FIELDS,
    RolloutFunc,
    TRLRolloutOptions,
    env_reward,
    episode_to_trl_row,
    make_rollout_func,
    shuffled_env_reward,
)
from .trainer import build_grpo_trainer

__all__ = [
    "CopyWeights",
    "EXTRA_FIELDS",
    "EnvRolloutWorker",
    "PROMPT_KEY",
    "PolicyLock",
    "RolloutFunc",
    "ServerWeightReload",
    "TRLRolloutOptions",
    "TRLSampling",
    "TrainerPolicyAgent",
    "VLLMColocateAgent",
    "VLLMServerAgent",
    "build_async_grpo_trainer",
    "build_grpo_trainer",
    "env_reward",
    "episode_to_trl_row",
    "generation_mode",
    "make_rollout_func",
    "reload_weights_sync",
    "shuffled_env_reward",
    "stop_token_ids",
    "task_from_prompt",
    "to_trl_dataset",
]
