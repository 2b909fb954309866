"""The plan of a training run, checked before any work (``hf-rollouts train CONFIG --dry-run``): the config, the
task rows (the trust rule of :func:`~hf_rollouts.envs.registry.validate_tasks` included), the model (can it be
loaded, its size) and the memory it needs (:class:`MemoryPlan`: the trainer's weights, gradients and AdamW states
at the model's dtype, and the engine's KV cache), against the memory this machine has.

The model is not loaded when it need not be: a hub id or folder is built on torch's ``meta`` device from its
config (its files are checked, its weights never read); the named specs (``tiny``, ``smollm2``...) are built as the
run would build them. Activations are not in the plan (they depend on the rollouts' lengths; the minibatch size
bounds them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .train_config import ENGINES, TrainConfig, resume_mismatches

GiB, MiB = float(1 << 30), float(1 << 20)
NAMED_MODELS = ("tiny", "tiny-small", "smollm2", "smollm2-tools")
PROMPT_TOKENS = 256
"""The prompt length a turn is assumed to have in the transformers agent's KV-cache estimate."""


@dataclass
class MemoryPlan:
    """Bytes the run needs: ``weights``, ``grads`` and ``optimizer`` (AdamW: two states per trainable parameter),
    ``adapter`` (LoRA weights), ``engine_weights`` (vLLM's copy) and ``kv_cache`` (vLLM's reserved cache, or the
    transformers agent's cache for a round at :data:`PROMPT_TOKENS` of prompt a turn)."""

    weights: int
    grads: int
    optimizer: int
    adapter: int
    engine_weights: int
    kv_cache: int
    kv_note: str
    available: int | None

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.adapter + self.engine_weights + self.kv_cache


@dataclass
class RunPlan:
    """What :func:`plan_run` found: a line per check, and the problems that stop the run (``ok``: none)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    memory: MemoryPlan | None = None
    parameters: int = 0
    trainable: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        verdict = (
            "the run can start" if self.ok else "the run cannot start:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )
        return "\n".join(["plan (hf-rollouts train --dry-run):", *(f"  {line}" for line in self.lines), verdict])


def available_memory() -> int | None:
    """Bytes free for the run: the GPU's free memory where there is one, else ``MemAvailable`` of /proc/meminfo."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_for_plan(cfg: TrainConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for the plan: a named spec built as the run builds it, anything else on ``meta``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..agents.loading import check_local_model, load_agent

    spec = "tiny-small" if cfg.model == "tiny" and cfg.model_size != "tiny" else cfg.model
    if spec in NAMED_MODELS:
        loaded = load_agent(spec, model_seed=cfg.seed)
        return loaded.model, loaded.tokenizer
    check_local_model(spec)
    config = AutoConfig.from_pretrained(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(spec)
    return model, tokenizer


def count_trainable(model: Any, cfg: TrainConfig) -> tuple[int, int]:
    """``(trainable parameters, LoRA adapter parameters)`` of the run on ``model``."""
    import torch

    if cfg.lora_rank:  # peft's all-linear: every nn.Linear but the output layer
        out = model.get_output_embeddings()
        lora = sum(cfg.lora_rank * (m.in_features + m.out_features) for m in model.modules()
                   if isinstance(m, torch.nn.Linear) and m is not out)  # fmt: skip
        return lora, lora
    if cfg.trainable_layers:
        base = getattr(model, "base_model", model)
        top = [*base.layers[len(base.layers) - cfg.trainable_layers :], base.norm]
        return sum(p.numel() for m in top for p in m.parameters()), 0
    return sum(p.numel() for p in model.parameters()), 0


def memory_plan(model: Any, cfg: TrainConfig) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``cfg`` on ``model`` (its dtype's bytes for every state)."""
    first = next(model.parameters())
    size, params = first.element_size(), sum(p.numel() for p in model.parameters())
    trainable, adapter = count_trainable(model, cfg)
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * heads * head_dim * size
    if cfg.backend in ENGINES:  # vllm-server: the same memory, in the server's processes
        kv, note, engine = int(cfg.kv_cache_gib * GiB), f"vLLM's --kv-cache-gib {cfg.kv_cache_gib}", params * size
    else:
        sequences, tokens = cfg.tasks_per_iter * cfg.num_rollouts, cfg.max_turns * (PROMPT_TOKENS + cfg.max_new_tokens)
        kv, engine = sequences * tokens * per_token, 0
        note = f"{sequences} sequences x {tokens} tokens (assumed {PROMPT_TOKENS} prompt tokens a turn)"
    return MemoryPlan(params * size, trainable * size, 2 * trainable * size, adapter * size, engine, kv, note,
                      available_memory())  # fmt: skip


def _task_lines(cfg: TrainConfig, tokenizer: Any, plan: RunPlan) -> None:
    from ..envs.registry import validate_tasks
    from . import runs
    from .splits import task_splits

    try:
        train_rows, held = task_splits(
            tokenizer, env=cfg.env, env_config=runs.env_config_of(cfg), tasks=cfg.tasks,
            eval_tasks=cfg.eval_tasks_path, num_train=cfg.tasks_per_iter * cfg.iterations, num_eval=cfg.eval_tasks,
        )  # fmt: skip
        classes = set()
        for rows in (train_rows, held):
            if rows is not None:
                classes |= set(validate_tasks(rows))  # the trust rule: envs named by data are checked here
    except Exception as exc:  # any refusal (untrusted env, bad row, missing file) stops the plan with its reason
        plan.problems.append(f"task rows: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return
    n = len(train_rows) if train_rows is not None else 0
    needed = cfg.tasks_per_iter * cfg.iterations
    repeat = f" (rows repeat: {needed} row-rounds from {n} rows)" if 0 < n < needed else ""
    plan.lines.append(f"tasks       {n} train rows{repeat}, {len(held) if held is not None else 0} held-out rows; "
                      f"env classes checked: {', '.join(sorted(classes)) or '-'}")  # fmt: skip
    if cfg.iterations and not n:
        plan.problems.append("task rows: no train rows (give --tasks or an --env that makes them).")


def plan_run(cfg: TrainConfig) -> RunPlan:
    """Check ``cfg`` (already through :func:`~.train_config.check_config`) and return the :class:`RunPlan`."""
    from .checkpoint import latest_checkpoint

    plan = RunPlan()
    episodes = cfg.iterations * cfg.tasks_per_iter * cfg.num_rollouts
    plan.lines.append(f"config      {cfg.iterations} rounds x {cfg.tasks_per_iter} tasks x {cfg.num_rollouts} "
                      f"rollouts = {episodes} episodes; backend {cfg.backend}; output {cfg.output_dir}")  # fmt: skip
    try:
        model, tokenizer = load_for_plan(cfg)
    except Exception as exc:  # not loadable: say why
        plan.problems.append(f"model {cfg.model}: cannot load: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return plan
    _task_lines(cfg, tokenizer, plan)
    mem = plan.memory = memory_plan(model, cfg)
    plan.parameters = sum(p.numel() for p in model.parameters())
    plan.trainable = count_trainable(model, cfg)[0]
    what = f"LoRA rank {cfg.lora_rank}" if cfg.lora_rank else (
        f"top {cfg.trainable_layers} layers" if cfg.trainable_layers else "every weight")  # fmt: skip
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    plan.lines.append(f"model       {cfg.model}: {plan.parameters / 1e6:.2f} M parameters, {dtype}; trains "
                      f"{plan.trainable / 1e6:.3f} M ({what})")  # fmt: skip
    free = f"{mem.available / GiB:.1f} GiB available" if mem.available else "available memory unknown"
    plan.lines.append(f"memory      trainer {(mem.weights + mem.grads + mem.optimizer + mem.adapter) / MiB:.1f} MiB "
                      f"(weights {mem.weights / MiB:.1f}, grads {mem.grads / MiB:.1f}, AdamW {mem.optimizer / MiB:.1f}"
                      f", adapter {mem.adapter / MiB:.1f}); engine {(mem.engine_weights + mem.kv_cache) / MiB:.1f} MiB "
                      f"(weights {mem.engine_weights / MiB:.1f}, KV cache {mem.kv_cache / MiB:.1f}: {mem.kv_note}); "
                      f"total {mem.total / MiB:.1f} MiB of {free}; activations not counted")  # fmt: skip
    if mem.available and mem.total > mem.available:
        plan.problems.append(
            f"memory: the plan needs {mem.total / GiB:.2f} GiB, {mem.available / GiB:.2f} GiB free "
            "(lower --kv-cache-gib, --tasks-per-iter or train fewer weights: --lora-rank)"
        )
    root = Path(cfg.output_dir or ".") / "checkpoints"
    if cfg.resume:
        found = latest_checkpoint(root)
        wrong = resume_mismatches(found.state["config"], cfg) if found else []
        if found is None or wrong:
            plan.problems.append(f"--resume: {'no complete checkpoint under ' + str(root) if found is None else ''}"
                                 f"{'; '.join(wrong)}")  # fmt: skip
        else:
            plan.lines.append(f"resume      from {found.path} (round {found.round}): rounds {found.round + 1}.."
                              f"{cfg.iterations - 1} to go")  # fmt: skip
    elif root.is_dir() and any(root.iterdir()):
        plan.lines.append(f"note        {root} has checkpoints; without --resume the run starts over")
    if cfg.checkpoint_every:
        what = "the adapter" if cfg.lora_rank else "every weight"
        plan.lines.append(f"checkpoints every {cfg.checkpoint_every} rounds and after the last, in {root} (keep "
                          f"{cfg.keep_checkpoints}; {what} + AdamW)")  # fmt: skip
    needs = {"trackio": ("trackio", cfg.report_to == "trackio"), "peft": ("lora", bool(cfg.lora_rank))}
    for package, (extra, needed) in needs.items():
        if needed and importlib.util.find_spec(package) is None:
            plan.problems.append(f"{package} is not installed: pip install 'hf_rollouts[{extra}]'")
    if cfg.report_to == "trackio":
        plan.lines.append(f"tracking    trackio, project 'hf_rollouts', in $TRACKIO_DIR or {cfg.output_dir}/trackio")
    return plan


__all__ = ["MemoryPlan", "RunPlan", "available_memory", "count_trainable", "load_for_plan", "memory_plan",
           "plan_run"]  # fmt: skip
