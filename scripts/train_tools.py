"""Teach a model to use a tool: an imitation warm start, then GRPO with the env's reward (library loop pieces).

Default: the tiny model on ``hidden_function`` (each task hides ``f(x) = a*x + b``; only the tool ``hidden_f`` tells
it; two turns: the call, then the number it returned). The random model never writes a tool call, so pure RL would
see a reward of 0 in every group. Three phases:

1. **Demonstrations** (:class:`hf_rollouts.recipes.demonstrations.Demonstrator`): a scripted token-level policy
   plays the train tasks through the pipeline, calling the tool on its first turn with probability
   ``--demo-tool-rate`` (else guessing a number).
2. **SFT** (:func:`hf_rollouts.training.sft_update`): cross-entropy on the demonstrations' agent tokens only (tool
   output and prompts are not in the loss): imitation alone is capped near ``--demo-tool-rate`` (``--sft-only``).
3. **GRPO** (:func:`~hf_rollouts.rounds.collect_rollouts`, :func:`~hf_rollouts.training.grpo_update`), or with
   ``--trl`` TRL's ``GRPOTrainer`` (:func:`hf_rollouts.integrations.trl.build_grpo_trainer`).

The held-out ``eval`` split is played as loaded, after SFT and after GRPO. With the tiny model the script runs end to
end but does not learn the task (it learns the call format, not to copy ``x``). **SmolLM2 on the calculator**
(docs/guides/training.md): ``--model smollm2-tools --env calculator`` (measured: held-out success 0.14 after the
warm start, 0.99 after GRPO; the control, ``--control shuffle``, 0.28)::

    python scripts/train_tools.py                    # tiny model, CPU; --sft-only / --trl / --control shuffle

**Through a harness**: ``--env program-calculator`` plays the same tasks (``--env-config`` is the calculator env's,
e.g. ``'{"operators": "*"}'``) as ``ProgramEnv`` rows of ``scripts/calculator_agent.py``, a plain ``openai``-SDK
loop with a ``calculator`` tool, scored by the ``numeric`` verifier on its final answer's last number: every model
call (the demonstrator's too, answering the harness through the endpoint) is recorded token-exactly and trained on
(docs/guides/agent-programs.md). ``--with-control`` then runs the shuffled control from the same warm start in the
same process (the weights restored; ``OUTPUT_DIR/control/summary.json``). Measured on multiplications: held-out
0.27 after the warm start, 0.92 after 4 GRPO rounds, the control 0.86 (docs/learning_program_calculator.json).

``train(ToolTrainConfig(...))`` returns a :class:`ToolTrainResult`; ``summary.json`` records ``heldout_base`` (as
loaded), ``heldout_before`` (after SFT, where RL starts) and ``heldout_after``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_rollouts import recipes, training
from hf_rollouts.envs import get_env_class
from hf_rollouts.recipes import demonstrations as demo
from hf_rollouts.recipes import runs
from hf_rollouts.recipes.demonstrations import DEMO_CALLS, Demonstrator, Point, measure
from hf_rollouts.rounds import collect_rollouts
from hf_rollouts.seeding import derive_seed
from hf_rollouts.task_json import decode_task_value

HERE = Path(__file__).resolve().parent
PROGRAM_ENVS = {"program-calculator": "calculator"}
"""Envs played through an agent program (a harness): the name, and the env whose tasks and demonstrator it uses."""
PROGRAM = "calculator_agent:run"
"""The harness of ``program-calculator`` (``scripts/calculator_agent.py``, a plain ``openai`` loop with tools)."""
HELPS = {
    "env": f"One of {sorted(DEMO_CALLS) + sorted(PROGRAM_ENVS)} (program-*: through a harness, see --help's top).",
    "lr": "GRPO AdamW learning rate.",
    "max_new_tokens": "Token budget of one agent turn (a call is 57).",
    "eval_tasks": "Held-out eval tasks played before and after.",
    "eval_rollouts": "Rollouts per eval task.",
    "max_grad_norm": "Gradient clipping norm (SFT and GRPO).",
    "minibatch_size": "Rollouts per GRPO optimizer step.",
}
Run = runs.with_defaults(runs.RunOptions, HELPS, output_dir="outputs/train_tools", env="hidden_function", max_turns=2,
                         eval_tasks=64, eval_rollouts=2, lr=3e-3, max_new_tokens=64)  # fmt: skip
Rounds = runs.with_defaults(runs.RoundOptions, HELPS, tasks_per_iter=16, max_grad_norm=1.0, minibatch_size=64)


@dataclass
class ToolTrainConfig(Run, Rounds):
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    max_coef: int = runs.flag(9, "hidden_function max_coef (a, b in 1..max_coef).")
    max_x: int = runs.flag(9, "hidden_function max_x (x in 1..max_x).")
    demo_tool_rate: float = runs.flag(0.5, "Share of demonstrations whose first turn calls the tool (others guess).")
    demo_tasks: int = runs.flag(64, "Train tasks the demonstrator plays.")
    demo_rollouts: int = runs.flag(4, "Demonstrations per task.")
    sft_steps: int = runs.flag(150, "SFT optimizer steps.")
    sft_batch_size: int = runs.flag(32, "Demonstrations per SFT step.")
    sft_lr: float = runs.flag(3e-3, "SFT AdamW learning rate.")
    eval_base: bool = runs.flag(True, "Also evaluate the model as loaded (--no-eval-base: skip it, it is NaN).")
    sft_only: bool = runs.flag(False, "Control: replace GRPO by as many more SFT updates on the demonstrations.")
    trl: bool = runs.flag(False, "Run the GRPO phase with TRL's GRPOTrainer.")
    with_control: bool = runs.flag(
        False,
        "Then the control arm in the same run: the warm start's weights restored, "
        "--iterations rounds with advantages shuffled (OUTPUT_DIR/control/summary.json).",
    )


@dataclass
class ToolTrainResult:
    eval_before: Point
    eval_after_sft: Point
    eval_after: Point
    demos: Point
    sft: list[Point]
    grpo: list[Point]
    seconds: float
    control: list[Point] = dataclasses.field(default_factory=list)
    eval_after_control: Point | None = None


def train(cfg: ToolTrainConfig, command: str | None = None) -> ToolTrainResult:
    """Run the three phases; float32 denormals are flushed meanwhile (the tiny model runs 10-20x slower on them)."""
    if cfg.env not in DEMO_CALLS and cfg.env not in PROGRAM_ENVS:
        raise ValueError(f"--env must be one of {sorted(DEMO_CALLS) + sorted(PROGRAM_ENVS)}, got {cfg.env!r}.")
    if cfg.env in PROGRAM_ENVS and cfg.trl:
        raise ValueError("--trl plays the env's own episodes: run program-* envs with our loop (drop --trl).")
    if cfg.with_control and (cfg.trl or cfg.sft_only or cfg.control != "none"):
        raise ValueError(
            "--with-control runs the shuffled control after our GRPO loop: not with --trl, --sft-only or --control."
        )
    if cfg.control not in runs.CONTROLS or (cfg.control == "shuffle" and cfg.sft_only):
        raise ValueError(f"--control must be 'none' or 'shuffle' (not with --sft-only), got {cfg.control!r}.")
    with training.flush_denormals():
        return _train(cfg, command)


def _train(cfg: ToolTrainConfig, command: str | None) -> ToolTrainResult:
    import datasets

    datasets.disable_progress_bars()
    started, out = (time.perf_counter(), time.process_time()), Path(cfg.output_dir)
    env_name = PROGRAM_ENVS.get(cfg.env, cfg.env)
    call = DEMO_CALLS[env_name]
    model, tokenizer, agent, params = runs.load_policy(cfg, suffix="tools")
    pad = tokenizer.pad_token_id
    env = get_env_class(env_name)(tokenizer, runs.env_config_of(cfg) or {})
    train_tasks = env.get_train_dataset(cfg.demo_tasks + max(1, cfg.iterations) * cfg.tasks_per_iter)
    eval_tasks = env.get_eval_dataset(cfg.eval_tasks)
    if cfg.env in PROGRAM_ENVS:
        train_tasks, eval_tasks = (program_tasks(env, t, cfg.max_turns) for t in (train_tasks, eval_tasks))
    rl_tasks = train_tasks.select(range(cfg.demo_tasks, len(train_tasks)))
    allowed = {"allowed_env_modules": [PROGRAM.partition(":")[0]]} if cfg.env in PROGRAM_ENVS else {}

    def evaluate(phase: str) -> Point:
        t, seed = time.perf_counter(), derive_seed("train_tools_eval", cfg.seed)
        rollouts = collect_rollouts(eval_tasks, agent, cfg.eval_rollouts, seed=seed, **allowed)
        point = measure(rollouts, phase, 0, time.perf_counter() - t, call=call)
        if not cfg.quiet:
            print(f"eval ({phase}): {demo.format_point(point)}", flush=True)
        return point

    eval_before = evaluate("eval_before") if cfg.eval_base else Point("eval_before", 0, *[math.nan] * 4, 0, 0, 0.0)
    demonstrator = Demonstrator(tokenizer, cfg.demo_tool_rate, demo.max_answer(env_name, env.config), call=call)
    demo_tasks, seed = train_tasks.select(range(cfg.demo_tasks)), derive_seed("train_tools_demos", cfg.seed)
    demos = collect_rollouts(demo_tasks, demonstrator, cfg.demo_rollouts, seed=seed, **allowed)
    demo_point = measure(demos, "demos", 0, 0.0, call=call)
    demo_rows = training.prepare_rollouts(demos, flatten=True, drop_constant_groups=False, progress=False).dataset
    if not cfg.quiet:
        print(f"demonstrations: {demo.format_point(demo_point)}", flush=True)
    sft_opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
    t = time.perf_counter()
    sft = dict(pad_token_id=pad, batch_size=cfg.sft_batch_size, max_grad_norm=cfg.max_grad_norm)
    losses = training.sft_update(
        model, sft_opt, demo_rows, steps=cfg.sft_steps, seed=derive_seed("sft", cfg.seed), **sft
    )
    sft_points = [Point("sft", cfg.sft_steps, *[math.nan] * 4, 0, 0, time.perf_counter() - t, losses[-1])]
    eval_after_sft = evaluate("eval_after_sft")
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    update = training.UpdateConfig(cfg.minibatch_size, 1, cfg.clip_eps, 0.0, cfg.max_grad_norm, share_prefix=True)

    def rounds(control: str) -> list[Point]:
        points, phase = [], "sft_only" if cfg.sft_only else "control" if control == "shuffle" else "grpo"
        for it in range(cfg.iterations):
            t, seed = time.perf_counter(), derive_seed("train_tools_grpo", cfg.seed, it)
            tasks = rl_tasks.select([(it * cfg.tasks_per_iter + k) % len(rl_tasks) for k in range(cfg.tasks_per_iter)])
            rollouts = collect_rollouts(tasks, agent, cfg.num_rollouts, seed=seed, **allowed)
            if cfg.sft_only:
                steps = max(1, round(cfg.num_rollouts * cfg.tasks_per_iter / cfg.minibatch_size))
                loss = training.sft_update(model, sft_opt, demo_rows, steps=steps, seed=seed, **sft)[-1]
            else:
                prepared = training.prepare_rollouts(rollouts, flatten=True, drop_constant_groups=True, progress=False)
                if control == "shuffle":
                    shuffled = training.shuffle_advantages(prepared.dataset, derive_seed("train_tools_control", seed))
                    prepared = dataclasses.replace(prepared, dataset=shuffled)
                loss = training.grpo_update(model, optimizer, prepared, pad_token_id=pad, config=update, seed=seed).loss
            points.append(measure(rollouts, phase, it, time.perf_counter() - t, loss, call=call))
            if not cfg.quiet:
                print(("" if it else f"{phase}:\n{demo.TOOL_HEADER}\n") + demo.format_tool_row(points[-1]), flush=True)
        return points

    warm = {k: v.detach().clone() for k, v in model.state_dict().items()} if cfg.with_control else None
    grpo = run_trl(model, tokenizer, rl_tasks, cfg) if cfg.trl else rounds(cfg.control)
    eval_after = evaluate("eval_after")
    result = ToolTrainResult(eval_before, eval_after_sft, eval_after, demo_point, sft_points, grpo,
                             time.perf_counter() - started[0])  # fmt: skip
    steps = [{"step": p.step + 1, "reward": p.success, "tool_rate": p.tool_rate} for p in grpo]
    evals = {"heldout_base": eval_before, "heldout_before": eval_after_sft, "heldout_after": eval_after}
    recipes.write_summary(out, command=command, config=dataclasses.asdict(cfg), steps=steps, started=started,
                           **{k: p.as_heldout() for k, p in evals.items()})  # fmt: skip
    if warm is not None:  # the control arm: the same warm start, a fresh optimizer, each group's advantages shuffled
        control_started = (time.perf_counter(), time.process_time())
        model.load_state_dict(warm)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        result.control = rounds("shuffle")
        result.eval_after_control = evaluate("eval_after_control")
        result.seconds = time.perf_counter() - started[0]
        steps = [{"step": p.step + 1, "reward": p.success, "tool_rate": p.tool_rate} for p in result.control]
        evals = {**evals, "heldout_after": result.eval_after_control}
        recipes.write_summary(out / "control", command=command, config=dataclasses.asdict(cfg), steps=steps,
                               started=control_started, **{k: p.as_heldout() for k, p in evals.items()})  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(
        json.dumps({"config": dataclasses.asdict(cfg), "result": dataclasses.asdict(result)}, indent=1)
    )
    plot = cfg.plot if cfg.plot is not None else str(out / "tool_learning.png")
    if plot.lower() != "none":
        rounds = [{"x": p.step + 1, "success": p.success, "tool_rate": p.tool_rate, "loss": p.loss} for p in grpo]
        evals = ((-1, eval_before), (0, eval_after_sft), (len(grpo) + 1, eval_after))
        points = [(x, dataclasses.asdict(p)) for x, p in evals if not math.isnan(p.success)]
        title = f"{cfg.env} (tool use), {cfg.model}: SFT {cfg.sft_steps} steps, then {cfg.iterations} GRPO rounds"
        recipes.save_learning_curve(plot, rounds, heldout=points, title=title, curves=("success", "tool_rate"),
                                     xlabel="-1: as loaded, 0: after SFT, then GRPO rounds")  # fmt: skip
    return result


def program_tasks(env, tasks, max_calls: int):
    """``ProgramEnv`` rows playing :data:`PROGRAM` (the harness) on the env's tasks: each row's ``task_data`` is the
    env's (``a``, ``op``, ``b``, ``phrasing``: what :func:`measure` reads) plus what the harness sends (``system``,
    ``question``, ``max_calls``) and the ``answer`` its final text is scored against (verifier ``numeric`` on the
    text's last number, as the env scores its own episodes)."""
    from hf_rollouts.envs.program import program_task_rows

    if str(HERE) not in sys.path:  # the program's process imports the harness from this process's import path
        sys.path.append(str(HERE))
    rows = []
    for task in map(decode_task_value, tasks["task_data"]):
        question = env._initialize_episode("", task)
        rows.append({**task, "system": env._system_prompt(question), "question": question.text,
                     "answer": str(question.answer), "max_calls": max_calls})  # fmt: skip
    config = {"verifier": "numeric", "extraction": "last_number", "max_turns": max_calls}
    return program_task_rows(rows, PROGRAM, config, allowed_env_modules=[PROGRAM.partition(":")[0]])


def run_trl(model, tokenizer, tasks, cfg: ToolTrainConfig) -> list[Point]:
    """The GRPO phase with TRL's ``GRPOTrainer``: one rollout call per iteration, split into minibatches of
    ``--minibatch-size``; one :class:`Point` per iteration from TRL's logs (its mean env reward: 1 for a win)."""
    from hf_rollouts.integrations.trl import build_grpo_trainer

    per_call = max(1, cfg.tasks_per_iter * cfg.num_rollouts // cfg.minibatch_size)
    trainer, rollout_func = build_grpo_trainer(
        model, tokenizer, tasks, num_generations=cfg.num_rollouts, tasks_per_step=cfg.tasks_per_iter,
        steps_per_generation=per_call, max_steps=cfg.iterations * per_call, max_new_tokens=cfg.max_new_tokens,
        control=cfg.control, seed=cfg.seed, learning_rate=cfg.lr, temperature=cfg.temperature, bf16=False,
        max_grad_norm=cfg.max_grad_norm, epsilon=cfg.clip_eps,
    )  # fmt: skip
    trainer.train()
    model.eval()
    points = []
    for h in (h for h in trainer.state.log_history if "reward" in h):  # a log row per call carries the reward
        step = (int(h["step"]) - 1) // per_call
        rate = rollout_func.tool_rates[step] if step < len(rollout_func.tool_rates) else math.nan
        points.append(Point("trl", step, h["reward"], rate, *[math.nan] * 2, 0, 0, math.nan, h.get("loss", math.nan)))
        if not cfg.quiet:
            print(("" if len(points) > 1 else demo.TOOL_HEADER + "\n") + demo.format_tool_row(points[-1]), flush=True)
    return points


def main(argv: list[str] | None = None) -> int:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    r = train(cfg, command=shlex.join(["python", "scripts/train_tools.py", *argv]))
    rl = "SFT only" if cfg.sft_only else "GRPO, control: advantages shuffled" if cfg.control == "shuffle" else "GRPO"
    print(f"held-out success: {r.eval_before.success:.3f} (as loaded) -> {r.eval_after_sft.success:.3f} (after SFT) "
          f"-> {r.eval_after.success:.3f} (after {rl}); {r.seconds:.0f} s")  # fmt: skip
    if r.eval_after_control is not None:
        print(f"control (advantages shuffled, the same warm start): {r.eval_after_control.success:.3f}")
    return 0


def parse_args(argv: list[str] | None = None) -> ToolTrainConfig:
    """The flags of :class:`ToolTrainConfig`."""
    return runs.parse_options(ToolTrainConfig, argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    raise SystemExit(main())
