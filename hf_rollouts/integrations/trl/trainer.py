"""One call from an env's task rows to a TRL ``GRPOTrainer`` wired to hf_rollouts (:func:`build_grpo_trainer`)."""

from __future__ import annotations

import tempfile
from typing import Any

from .colocate import reload_weights_sync
from .dataset import to_trl_dataset
from .rollout import RolloutFunc, env_reward, make_rollout_func, shuffled_env_reward

CONTROLS = ("none", "shuffle")


def build_grpo_trainer(
    model: Any,
    tokenizer: Any,
    tasks: Any,
    *,
    num_generations: int = 8,
    tasks_per_step: int = 4,
    steps_per_generation: int = 1,
    max_steps: int = 30,
    max_new_tokens: int = 48,
    control: str = "none",
    seed: int = 0,
    output_dir: str | None = None,
    rollout_options: dict[str, Any] | None = None,
    peft_config: Any = None,
    **config: Any,
) -> tuple[Any, RolloutFunc]:
    """``(trainer, rollout_func)``: a ``GRPOTrainer`` on ``tasks`` (task rows: ``env.get_train_dataset(n)``) with
    the bridge: :func:`~.dataset.to_trl_dataset`, :func:`~.rollout.make_rollout_func` and :func:`~.rollout.env_reward`
    (``control="shuffle"``: :func:`~.rollout.shuffled_env_reward`, the control run).

    Each rollout call plays ``tasks_per_step`` tasks x ``num_generations`` episodes, split into
    ``steps_per_generation`` optimizer steps (TRL's ``steps_per_generation``; it must divide the episodes). Defaults
    suited to a loop of ours: a constant learning rate, a log row every step, no checkpoints or reports, no
    gradient checkpointing, the CPU when there is no GPU and bf16 only on a GPU, TRL's printer callback removed.
    ``config`` overrides or adds any ``GRPOConfig`` field (``learning_rate``, ``temperature``, ``bf16``,
    ``max_grad_norm``, ``epsilon``, ``use_vllm``, ...); ``rollout_options`` go to ``make_rollout_func`` (its
    ``allowed_env_modules`` / ``allowed_env_models`` to ``to_trl_dataset`` too). With
    ``use_vllm=True, vllm_mode="colocate"`` on a CPU the weights reach the engine through
    :func:`~.colocate.reload_weights_sync`. ``peft_config`` (a peft ``LoraConfig``, say) goes to ``GRPOTrainer``,
    which wraps ``model`` with ``get_peft_model``: only the adapter trains, and the agents sample with it (they
    call the trainer's model); in TRL's vLLM modes the adapter is merged into the weights for each sync (TRL's own
    sync, and :func:`~.colocate.reload_weights_sync` alike), so the engine receives full weights, not the adapter.
    ``rollout_func.tool_rates`` holds each call's tool-call rate.
    """
    import torch
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    if control not in CONTROLS:
        raise ValueError(f"control must be one of {CONTROLS}, got {control!r}.")
    episodes = tasks_per_step * num_generations
    if steps_per_generation < 1 or episodes % steps_per_generation:
        raise ValueError(
            f"tasks_per_step x num_generations ({episodes}) must split into steps_per_generation "
            f"({steps_per_generation}) equal minibatches."
        )
    on_cpu = not torch.cuda.is_available()
    settings = {
        "output_dir": output_dir or tempfile.mkdtemp(prefix="hf_rollouts_trl_"),
        "max_steps": max_steps,
        "num_generations": num_generations,
        "per_device_train_batch_size": episodes // steps_per_generation,
        "steps_per_generation": steps_per_generation,
        "seed": seed,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": on_cpu,
        "bf16": not on_cpu,
        "gradient_checkpointing": False,
        "vllm_mode": "server",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        **config,
    }
    rollout_options = rollout_options or {}
    rollout_func = make_rollout_func(max_new_tokens=max_new_tokens, **rollout_options)
    trust = {k: v for k, v in rollout_options.items() if k in ("allowed_env_modules", "allowed_env_models")}
    reward = shuffled_env_reward(num_generations, seed) if control == "shuffle" else env_reward
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=GRPOConfig(**settings),
        train_dataset=to_trl_dataset(tasks, **trust),  # the rows are checked as the rollout function checks them
        reward_funcs=[reward],
        rollout_func=rollout_func,
        peft_config=peft_config,
    )
    trainer.remove_callback(PrinterCallback)
    if settings.get("use_vllm") and settings.get("vllm_mode") == "colocate" and on_cpu:
        reload_weights_sync(trainer)  # TRL's per-parameter load_weights fails on vLLM's CPU backend (.colocate)
    return trainer, rollout_func
