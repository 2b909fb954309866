"""What the training scripts (``scripts/train_grpo.py``, ``train_tools.py``, ``train_trl.py``) share, so that each
keeps only its arguments, its outer loop and its plots.

* **Options, declared once**: :class:`RunOptions` (every script), :class:`TaskFileOptions` (task rows from files
  and the toy env) and :class:`RoundOptions` (our generate-then-update rounds) are dataclasses whose fields carry
  the flag's help; a script's config inherits them, :func:`with_defaults` gives a field the script's own default,
  and :func:`parse_options` makes the parser with transformers' ``HfArgumentParser``, the mechanism of
  :mod:`hf_rollouts.cli_options`.
* **Set-up**: :func:`load_policy` (the model, its tokenizer and a sampling agent on it), :func:`env_config_of`
  (``--env-config`` or the env's own flags), :func:`heldout` (a held-out evaluation, printed).
* **The printed tables**: :class:`IterationStats` / :func:`format_row` (our GRPO loop), :class:`StepRow` /
  :func:`format_steps` (TRL's logs).
* **Tool use** (:mod:`.demonstrations`): the scripted demonstrator and its metrics.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any

CONTROLS = ("none", "shuffle")


def flag(default: Any, help: str) -> Any:
    """A dataclass field that is a ``--flag`` with this ``help``."""
    return field(default=default, metadata={"help": help})


@dataclass
class RunOptions:
    """The flags of every training script."""

    seed: int = flag(0, "Seeds the model init, sampling, demonstrations and minibatch order.")
    output_dir: str | None = flag(None, "metrics.json, summary.json and the plot go here.")
    model: str = flag("tiny", "'tiny' (embedded, random init), 'smollm2', 'smollm2-tools' (a Hermes tool template) "
                      "or a model id/path.")  # fmt: skip
    env: str = flag("guess_number", "A registered env name or an env class path.")
    env_config: str | None = flag(None, "The env's env_config as JSON (else from the env's flags; guess_number: "
                                  "--low, --high, --max-turns; hidden_function: --max-coef, --max-x, "
                                  "--max-turns).")  # fmt: skip
    max_turns: int = flag(1, "The env's max_turns (guess_number, hidden_function; tool turns count).")
    eval_tasks: int = flag(0, "Held-out rows (the env's eval split or --eval-tasks-path) to evaluate on; 0: no.")
    eval_rollouts: int = flag(1, "Episodes per held-out row.")
    control: str = flag("none", f"One of {CONTROLS}: 'shuffle' is the control run, each group's advantages (TRL: "
                        "rewards) shuffled within the group.")  # fmt: skip
    trainable_layers: int = flag(0, "Train only the top N decoder layers and the final norm (0: every parameter).")
    lr: float = flag(1e-2, "AdamW learning rate (constant).")
    max_new_tokens: int = flag(3, "Token budget of one agent turn.")
    temperature: float = flag(1.0, "Sampling temperature (log-probs are recomputed at the one the rollouts record).")
    quiet: bool = flag(False, "Do not print the table.")


@dataclass
class TaskFileOptions:
    """Task rows from files, or the toy ``guess_number`` env's range."""

    tasks: str | None = flag(None, "Task rows to train on (save_to_disk folder, .json/.jsonl/.parquet); no --env then.")
    eval_tasks_path: str | None = flag(None, "Held-out task rows (as --tasks); --eval-tasks N takes the first N.")
    low: int = flag(3, "GuessNumberEnv low.")
    high: int = flag(3, "GuessNumberEnv high (== low: a fixed answer the policy can learn).")


@dataclass
class RoundOptions:
    """Our generate-then-update rounds (:func:`~hf_rollouts.rounds.collect_rollouts`,
    :func:`~hf_rollouts.training.grpo_update`)."""

    iterations: int = flag(20, "GRPO generate-then-update rounds.")
    tasks_per_iter: int = flag(32, "Task rows (GRPO groups) per iteration.")
    num_rollouts: int = flag(8, "Rollouts per task (the group size).")
    minibatch_size: int = flag(64, "Rollouts per optimizer step (16 for SmolLM2).")
    clip_eps: float = flag(0.2, "PPO ratio clip.")
    max_grad_norm: float = flag(1.0, "Gradient clipping norm.")
    plot: str | None = flag(None, "PNG path (else the learning curve in OUTPUT_DIR); 'none' to skip.")


def with_defaults(cls: type, helps: dict[str, str] | None = None, **defaults: Any) -> type:
    """A dataclass subclass of ``cls`` whose fields named in ``defaults`` have those defaults (and ``helps``' help
    text where given): one script's defaults for the shared options."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in defaults:
            help = (helps or {}).get(f.name, f.metadata["help"])
            fields.append(
                (f.name, hints[f.name], field(default=defaults[f.name], metadata={**f.metadata, "help": help}))
            )
    unknown = set(defaults) - {f[0] for f in fields}
    if unknown:
        raise ValueError(f"with_defaults: {sorted(unknown)} are not fields of {cls.__name__}.")
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,))


def parse_options(cls: type, argv: list[str] | None = None, description: str | None = None) -> Any:
    """``cls`` (a dataclass of flags) from the command line, with transformers' ``HfArgumentParser``."""
    from transformers import HfArgumentParser

    (options,) = HfArgumentParser(cls, description=description).parse_args_into_dataclasses(argv)
    if getattr(options, "control", "none") not in CONTROLS:
        raise ValueError(f"--control must be one of {CONTROLS}, got {options.control!r}.")
    return options


def env_config_of(options: Any) -> dict[str, Any] | None:
    """``--env-config`` (JSON), else the env's own flags (``guess_number``: ``--low``, ``--high``, ``--max-turns``;
    ``hidden_function``: ``--max-coef``, ``--max-x``, ``--max-turns``), else ``None`` (the env's defaults)."""
    if options.env_config:
        return json.loads(options.env_config)
    own = {"guess_number": ("low", "high", "max_turns"), "hidden_function": ("max_coef", "max_x", "max_turns")}
    names = own.get(options.env, ())
    if names and all(hasattr(options, n) for n in names):
        return {n: getattr(options, n) for n in names}
    return None


def load_policy(options: Any, *, spec: str | None = None, suffix: str | None = None, device: Any = None):
    """``(model, tokenizer, agent, params)``: ``load_agent(spec or options.model)`` seeded by ``options.seed`` (the
    torch seed too), the top ``options.trainable_layers`` layers left trainable (all when 0; ``params`` are the
    trainable parameters), and a :class:`~hf_rollouts.agents.hf.TransformersAgent` sampling from the model at
    ``options.temperature`` with ``options.max_new_tokens`` a turn (the policy: updates change it in place), named
    ``MODEL-suffix`` with a ``suffix``."""
    import torch

    from ..agents.hf import TransformersAgent
    from ..agents.loading import load_agent
    from ..training.partial import train_top_layers

    torch.manual_seed(options.seed)
    loaded = load_agent(spec or options.model, model_seed=options.seed)
    model, tokenizer = loaded.model, loaded.tokenizer
    agent = TransformersAgent(model, tokenizer, temperature=options.temperature, max_new_tokens=options.max_new_tokens,
                              seed=options.seed, device=device,
                              name=f"{model.config._name_or_path}-{suffix}" if suffix else None)  # fmt: skip
    params = train_top_layers(model, options.trainable_layers) if options.trainable_layers else None
    return model, tokenizer, agent, params or list(model.parameters())


def heldout(tasks: Any, agent: Any, options: Any, tag: str, *, show: bool = True) -> dict[str, Any] | None:
    """The held-out evaluation of the scripts (:func:`hf_rollouts.evaluation.evaluate_agent`, the same rows and seed
    in every script and at every point of a run) as :meth:`~hf_rollouts.evaluation.Evaluation.as_dict`, printed
    unless ``options.quiet``; ``None`` without held-out rows."""
    from ..evaluation import evaluate_agent
    from ..seeding import derive_seed

    if tasks is None:
        return None
    result = evaluate_agent(tasks, agent, options.eval_rollouts, seed=derive_seed("train_grpo_eval", options.seed))
    if show and not options.quiet:
        print(f"held-out ({tag}): {result.describe()}", flush=True)
    return result.as_dict()


def number(x: float | None, width: int, digits: int) -> str:
    """``x`` in a table cell; ``-`` for None or NaN (e.g. no update happened)."""
    return f"{'-':>{width}}" if x is None or math.isnan(x) else f"{x:>{width}.{digits}f}"


@dataclass
class IterationStats:
    """One row of a GRPO learning curve: ``mean_reward`` and ``solve_rate`` (the ``solved`` column; errors count as
    unsolved) of the rollouts sampled before the iteration's update, the update's means (NaN without a step),
    rollouts kept / generated, whether the agent's fingerprint moved, and the held-out evaluation after, if any."""

    iteration: int
    mean_reward: float
    solve_rate: float
    loss: float
    trained_rollouts: int
    rollouts: int
    errors: int
    clip_fraction: float
    approx_kl: float
    grad_norm: float
    fingerprint_changed: bool
    seconds: float
    tool_rate: float = 0.0
    heldout: dict | None = None
    phases: dict[str, float] | None = None
    """Seconds of each phase of the round (``collect``, ``update``, and ``sync``, ``gap`` where they ran)."""
    logprob_gap: dict | None = None
    """The round's sampler/trainer gap (:class:`~hf_rollouts.training.LogprobGap` as a dict), when measured."""
    groups: dict[str, int] | None = None
    """The round's groups: ``total``, ``kept`` (trained on), ``constant`` (equal rewards: nothing to learn)."""
    importance: dict[str, float] | None = None
    """With an importance-sampling cap: ``mean`` weight and the ``capped`` share of loss tokens; the update's
    ``logprob_gap_max`` / ``_mean`` go to :attr:`logprob_gap` when it was not measured on its own."""
    agent_tokens: int | None = None
    """Tokens the agent sampled in the round (tokens per second: over the ``collect`` phase)."""
    staleness: dict | None = None
    """Overlapped rounds (``max_staleness`` > 0): the round's ``policy_version``, the trainer's ``trainer_version``,
    ``rollouts_dropped`` / ``groups_dropped`` (too old) and ``{staleness: rollouts}``
    (:meth:`~hf_rollouts.training.StalenessReport.as_metrics`); ``None`` in the synchronous loop."""


TABLE_HEADER = (
    f"{'iter':>4} | {'mean_reward':>11} | {'solve_rate':>10} | {'loss':>8} | {'grad_norm':>9} | "
    f"{'trained':>7} | {'clip':>5} | {'sec':>5}"
)
"""The header of :func:`format_row`'s table."""


def format_row(s: IterationStats) -> str:
    """One line of the GRPO table; ``-`` where no update happened (every group had equal rewards and was dropped)."""
    return (
        f"{s.iteration:>4} | {s.mean_reward:>11.4f} | {s.solve_rate:>10.4f} | {number(s.loss, 8, 4)} | "
        f"{number(s.grad_norm, 9, 4)} | {s.trained_rollouts:>3}/{s.rollouts:<3} | {number(s.clip_fraction, 5, 3)} | "
        f"{s.seconds:>5.1f}"
    )


@dataclass
class StepRow:
    """One optimizer step of a TRL run, from ``trainer.state.log_history`` (:func:`step_rows`)."""

    step: int
    reward: float
    reward_std: float
    frac_reward_zero_std: float
    grad_norm: float
    agent_tokens: float
    tool_rate: float = 0.0
    """Share of the step's episodes that called a tool (the rollout function's ``tool_rates``)."""


def step_rows(log_history: list[dict], tool_rates: list[float], per_call: int) -> list[StepRow]:
    """A :class:`StepRow` per logged step that carries a reward (``per_call`` optimizer steps per rollout call)."""
    rows = []
    for h in (h for h in log_history if "reward" in h):
        call = (int(h["step"]) - 1) // per_call
        rows.append(StepRow(int(h["step"]), h["reward"], h.get("reward_std", math.nan),
                            h.get("frac_reward_zero_std") or 0.0, h.get("grad_norm") or 0.0,
                            h.get("completions/mean_length") or 0.0,
                            tool_rates[call] if call < len(tool_rates) else math.nan))  # fmt: skip
    return rows


def format_steps(rows: list[StepRow]) -> str:
    """The TRL table: a line per step with a bar of its reward."""
    lines = [
        f"{'step':>4} | {'reward':>6} | {'std':>5} | {'zero-std groups':>15} | {'grad_norm':>9} | {'agent tok':>9}"
    ]
    for r in rows:
        bar = "#" * round(20 * max(0.0, min(1.0, r.reward)))
        lines.append(f"{r.step:>4} | {r.reward:>6.3f} | {r.reward_std:>5.2f} | {r.frac_reward_zero_std:>15.2f} | "
                     f"{r.grad_norm:>9.3f} | {r.agent_tokens:>9.2f} {bar}")  # fmt: skip
    return "\n".join(lines)


__all__ = [
    "CONTROLS",
    "IterationStats",
    "RoundOptions",
    "RunOptions",
    "StepRow",
    "TABLE_HEADER",
    "TaskFileOptions",
    "env_config_of",
    "flag",
    "format_row",
    "format_steps",
    "heldout",
    "load_policy",
    "number",
    "parse_options",
    "step_rows",
    "with_defaults",
]
