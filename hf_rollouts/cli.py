"""``hf-rollouts``: make task datasets, generate rollouts, inspect them.

Each command's options are a dataclass; the parser is generated from it
(transformers' ``HfArgumentParser``), so ``--help`` and the code never disagree.
Works under ``accelerate launch``: every process generates its shard, the main
process saves, pushes and prints. ``--executor ray`` expands the shards on Ray workers
(:class:`~hf_rollouts.executors.ExecutorOptions`); the flag is not ``--backend``, which
already names the local model's generation backend (``generate`` / ``continuous``).

Errors: a user error (a bad flag value, an untrusted or unknown env, bad task rows, a missing extra or model
folder, an unusable ``--output``) is one line, ``error: ...`` on stderr, saying what to fix, and exit code 2; a run
that failed (every episode failed, an endpoint that cannot be reached, a lost Ray shard) is one ``error:`` line and
exit code 1. ``--debug`` (anywhere on the command line) shows the traceback instead.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from .cli_options import CheckTemplateArgs, GenerateArgs, InspectArgs, TasksArgs
from .cli_train import run_train, train_parser
from .viewer.command import run_view, view_parser


class UsageError(Exception):
    """A mistake in the command line or its inputs: reported as one ``error:`` line, exit code 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's to fix (exit code 2): bad input the library refuses with a message that says
    what to do. Imported when needed, so ``--help`` stays fast."""
    from .agents.loading import ModelNotFoundError
    from .envs.config import EnvConfigError
    from .envs.task_data import TaskDataError
    from .publish.save import OutputDirError
    from .schema import TaskValidationError

    # ImportError: a missing extra (import_optional, vLLM, the SmolLM2 wheel), whose message names the install
    return (
        UsageError,
        TaskValidationError,
        EnvConfigError,
        TaskDataError,
        OutputDirError,
        ModelNotFoundError,
        ImportError,
    )


def run_failures() -> tuple[type[BaseException], ...]:
    """Exceptions that end a run that could not be done (exit code 1): a server that cannot be reached, a Ray shard
    that keeps failing."""
    from .agents.openai import OpenAIRequestError
    from .executors import ShardFailedError

    return (OpenAIRequestError, ShardFailedError)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (whitespace runs, newlines included, become one space)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _json_dict(text: str | None, flag: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} must be a JSON object, e.g. '{{\"max_turns\": 6}}' ({exc}).") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object, got {value!r}.")
    return value


def _check_output(output: str, overwrite: bool) -> None:
    """Refuse an unusable --output before any work (see :func:`~hf_rollouts.publish.save.check_output_dir`)."""
    from .publish.save import OutputDirError, check_output_dir

    try:
        check_output_dir(output, overwrite=overwrite)
    except OutputDirError as exc:
        raise UsageError(f"--output: {exc}") from None


def _make_tasks(
    env: str, split: str, num_tasks: int | None, env_config: str | None, allowed_env_modules: list[str] = ()
):
    from .envs import get_env_class
    from .envs.config import EnvConfigError
    from .envs.registry import resolve_env_spec
    from .tiny_model import build_tokenizer

    spec = env
    try:
        env, named = resolve_env_spec(env)  # e.g. textarena:Mastermind-v0, reasoning_gym:basic_arithmetic
        config = {**named, **_json_dict(env_config, "--env-config")}
        cls = get_env_class(env, allowed_env_modules)
    except KeyError as exc:  # an unknown short name: its message lists the known ones
        raise UsageError(f"--env {spec}: {exc.args[0]}") from exc
    except ValueError as exc:
        raise UsageError(f"--env {spec}: {exc}") from exc
    try:
        instance = cls(build_tokenizer(), config)
    except (EnvConfigError, ValueError, TypeError) as exc:  # a config or name the env refuses (says why)
        raise UsageError(f"--env {spec}: {cls.__name__} refused env_config {config}: {exc}") from exc
    try:
        return instance.get_eval_dataset(num_tasks) if split == "eval" else instance.get_train_dataset(num_tasks)
    except NotImplementedError as exc:  # an env over the user's own rows (dataset) makes no tasks
        raise UsageError(f"--env {spec}: {exc}") from exc


def tasks_parser() -> HfArgumentParser:
    return HfArgumentParser([TasksArgs], prog="hf-rollouts tasks")


def _dataset_tasks(args):
    """``tasks --from-dataset``: the source's rows as task rows of the dataset env, every row checked first."""
    from .envs.dataset import answer_column_option, load_source, to_task_rows

    config = _json_dict(args.env_config, "--env-config")
    if args.verifier:
        text = args.verifier.strip()
        try:
            config["verifier"] = json.loads(text) if text[:1] in "[{" else text
        except json.JSONDecodeError as exc:
            raise UsageError(f'--verifier is a name or a JSON spec, e.g. \'{{"name": "math"}}\' ({exc}).') from None
    if args.extraction:
        config["extraction"] = args.extraction
    try:
        ds = load_source(args.from_dataset, args.split, args.dataset_config)
    except (FileNotFoundError, ValueError, ConnectionError) as exc:  # ConnectionError: a Hub id, offline
        raise UsageError(f"--from-dataset {args.from_dataset}: {exc}") from exc
    if args.num_tasks is not None:
        ds = ds.select(range(min(args.num_tasks, len(ds))))
    prompt_column = None if args.prompt_template else args.prompt_column
    answer_column = answer_column_option(args.answer_column, args.tests_column)
    options = dict(prompt_column=prompt_column, answer_column=answer_column, prompt_template=args.prompt_template)
    options.update(answer_extraction=args.answer_extraction, tests_column=args.tests_column, columns=args.column)
    try:
        return to_task_rows(ds, **options, env_config=config, allowed_env_modules=args.allow_env_module)
    except ValueError as exc:  # a bad option (extraction, template); bad rows are TaskValidationErrors
        if isinstance(exc, user_errors()):
            raise
        raise UsageError(f"--from-dataset: {exc}") from exc


def cmd_tasks(argv: list[str]) -> int:
    (args,) = tasks_parser().parse_args_into_dataclasses(argv)
    if (args.env is None) == (args.from_dataset is None):
        raise UsageError("give exactly one of --env NAME or --from-dataset PATH_OR_NAME.")
    if args.env and args.split not in ("train", "eval"):
        raise UsageError(f"--split with --env is train or eval, got {args.split!r}.")
    _check_output(args.output, args.overwrite)
    if args.from_dataset:
        ds = _dataset_tasks(args)
    else:
        ds = _make_tasks(args.env, args.split, args.num_tasks, args.env_config, args.allow_env_module)
    from .publish.save import clear_output_dir

    if args.overwrite:
        clear_output_dir(args.output)
    ds.save_to_disk(args.output)
    print(f"wrote {len(ds)} {args.split} tasks of {args.env or args.from_dataset} to {args.output}")
    return 0


def _agent(args, sampling, options, executor: str):
    """The agent of ``generate``; with ``--executor ray``, the recipe the workers build it from when its fingerprint
    can be read without loading the model (:meth:`~hf_rollouts.agents.loading.AgentRecipe.fingerprint`), so the
    driver never loads it."""
    from .agents.loading import AgentRecipe

    recipe = AgentRecipe(
        spec=args.model,
        kwargs={
            "sampling": sampling,
            "seed": options.seed,
            "backend": args.backend,
            "reuse_kv": not args.no_reuse_kv,
            "cache": args.cache,
            "tokenizer": args.tokenizer,
            "trust_remote_code": args.trust_remote_code,
            "endpoint": {
                **({"concurrency": args.concurrency} if args.concurrency is not None else {}),
                "timeout": args.request_timeout,
                "max_retries": args.max_retries,
                "logprobs_mode": args.logprobs_mode,
            },
            "engine": {
                **({"concurrency": args.concurrency} if args.concurrency is not None else {}),
                "logprobs_mode": args.logprobs_mode,
                **_json_dict(args.engine_args, "--engine-args"),
            },
        },
    )
    if executor == "ray" and recipe.fingerprint() is not None:
        return recipe
    return recipe.build()


def _agent_info(agent) -> tuple[dict, object]:
    """What the card says about the agent, and its tokenizer (for a recipe: read from its files)."""
    from .agents.loading import AgentRecipe

    if isinstance(agent, AgentRecipe):  # a TransformersAgent that only the Ray workers loaded
        fingerprint = agent.fingerprint()
        info = {"model": fingerprint["model"], "sampling": fingerprint["sampling"], "device": "Ray workers"}
        return info, agent.load_tokenizer()
    return agent.describe(), agent.tokenizer


def generate_parser() -> HfArgumentParser:
    from .agents.sampling import SamplingConfig
    from .executors import ExecutorOptions
    from .pipeline import RolloutOptions

    return HfArgumentParser(
        [GenerateArgs, RolloutOptions, SamplingConfig, ExecutorOptions], prog="hf-rollouts generate"
    )


def cmd_generate(argv: list[str]) -> int:
    args, options, sampling, where = generate_parser().parse_args_into_dataclasses(argv)
    if (args.env is None) == (args.tasks is None):
        raise UsageError("give exactly one of --env NAME or --tasks DIR_OR_HUB_ID.")
    _check_output(args.output, args.overwrite)  # before any generation
    from dataclasses import asdict

    from .distributed import process_state
    from .pipeline import generate_rollouts
    from .publish import compute_stats, push_rollouts, render_card, save_rollouts, with_logprob_dtype
    from .sources import load_dataset_source

    n = args.num_tasks
    if args.env:
        tasks = _make_tasks(args.env, args.split, 8 if n is None else n, args.env_config, args.allow_env_module)
    elif n is not None and n < 1:
        raise UsageError(f"--num-tasks must be at least 1, got {n}.")
    else:  # --num-tasks: the first rows, as `tasks --from-dataset --num-tasks` takes them
        tasks = load_dataset_source(args.tasks)
        tasks = tasks if n is None else tasks.select(range(min(n, len(tasks))))
    import warnings

    from .agents.loading import ModelNotFoundError
    from .envs.config import UnknownConfigKeyWarning
    from .envs.registry import spec_trust, validate_tasks
    from .schema import as_task_dataset

    # what the user named in --env (openenv:URL, verifiers:ID) is allowed, as if given with --allow-env-*
    modules, models = spec_trust(args.env, args.allow_env_module) if args.env else ([], [])
    allowed_modules, allowed_models = [*args.allow_env_module, *modules], [*args.allow_env_model, *models]
    with warnings.catch_warnings():  # the rows' trust and configs, before a model loads (generate_rollouts warns)
        warnings.simplefilter("ignore", UnknownConfigKeyWarning)
        validate_tasks(as_task_dataset(tasks), allowed_modules, allowed_models)
    try:
        agent = _agent(args, sampling, options, where.executor)
    except (ValueError, TypeError) as exc:  # settings the agent refuses (e.g. processed log-probs with top_p < 1)
        raise UsageError(str(exc)) from exc
    except ModelNotFoundError:  # a --model folder that does not exist: the message says so
        raise
    except OSError as exc:  # a model that cannot be found or read (offline, no such Hub id, no config.json)
        raise UsageError(f"--model {args.model}: cannot load it: {exc}") from exc
    run = asdict(options)
    num_rollouts = run.pop("num_rollouts")
    from .executors import make_executor

    executor = make_executor(where)  # built here so that its report can be printed and put in the card
    ds = generate_rollouts(
        tasks,
        agent,
        num_rollouts,
        allowed_env_modules=allowed_modules,
        allowed_env_models=allowed_models,
        cache_dir=args.cache_dir,
        chat_template_kwargs=_json_dict(args.chat_template_kwargs, "--chat-template-kwargs"),
        executor=executor,
        **run,
    )
    state = process_state()
    if not state.is_main_process:
        return 0
    ds = with_logprob_dtype(ds, args.logprob_dtype)
    described, tokenizer = _agent_info(agent)
    info = {**described, "tokenizer": tokenizer.name_or_path or args.model}
    card = render_card(
        ds,
        agent_info=info,
        seed=options.seed,
        run_options=asdict(options),
        executor_report=executor.report,
        pad_token_id=tokenizer.pad_token_id,
        load_path=args.push_to_hub or str(Path(args.output).resolve()),
    )
    save_rollouts(ds, args.output, card, overwrite=args.overwrite)
    tokenizer.save_pretrained(str(Path(args.output) / "tokenizer"))
    stats = compute_stats(ds)
    print(
        f"\nwrote {len(ds)} tasks x {num_rollouts} rollouts to {args.output} (card: {Path(args.output) / 'README.md'})"
    )
    for key, value in stats.table():
        print(f"  {key:<22} {value}")
    for key, value in executor.report.rows():
        print(f"  {key:<22} {value}")
    if isinstance(getattr(agent, "stats", None), dict):  # an endpoint agent's request counters
        mode = info.get("mode")
        print(f"  agent{f' (mode {mode})' if mode else ''}: " + " ".join(f"{k}={v}" for k, v in agent.stats.items()))
    statuses = [s for row in ds["statuses"] for s in row]
    if statuses and all(s == "error" for s in statuses):
        first = next((e for row in ds["errors"] for e in row if e), "")
        print(
            f"error: every episode of this run failed ({len(statuses)} of {len(statuses)}); first error: {first}",
            file=sys.stderr,
        )
        return 1
    if args.push_to_hub:
        url = push_rollouts(ds, args.push_to_hub, card, private=args.private)
        print(f"pushed to {url}")
    return 0


def inspect_parser() -> HfArgumentParser:
    parser = HfArgumentParser([InspectArgs], prog="hf-rollouts inspect")
    parser.add_argument("path", help="Rollout dataset directory written by `hf-rollouts generate`.")
    return parser


def cmd_inspect(argv: list[str]) -> int:
    args, ns = inspect_parser().parse_args_into_dataclasses(argv)
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from .publish import compute_stats, format_trajectory

    root = Path(ns.path)
    if not (root / "state.json").is_file():
        raise UsageError(f"{root} is not a rollout dataset directory (no state.json); point at `generate --output`.")
    ds = load_from_disk(str(root))
    if args.best:
        args.row, args.rollout = best_rollout(ds["final_rewards"], ds["statuses"])
    if not 0 <= args.row < len(ds):
        raise UsageError(f"--row {args.row} is out of range; the dataset has {len(ds)} rows.")
    row = ds[args.row]
    if not 0 <= args.rollout < len(row["final_rewards"]):
        raise UsageError(
            f"--rollout {args.rollout} is out of range; row {args.row} has {len(row['final_rewards'])} rollouts."
        )
    tok_path = args.tokenizer or (str(root / "tokenizer") if (root / "tokenizer").is_dir() else None)
    tokenizer = AutoTokenizer.from_pretrained(tok_path) if tok_path else None
    print("=== summary")
    for key, value in compute_stats(ds).table():
        print(f"  {key:<22} {value}")
    print(f"=== row {args.row}, rollout {args.rollout}")
    print(format_trajectory(row, args.rollout, tokenizer))
    return 0


def best_rollout(final_rewards: list[list[float]], statuses: list[list[str]]) -> tuple[int, int]:
    """``(row, rollout)`` of the first rollout with the highest final reward among those that are not errors
    (``(0, 0)`` when every rollout is an error)."""
    best, where = -math.inf, (0, 0)
    for r, (rewards, states) in enumerate(zip(final_rewards, statuses)):
        for k, (reward, status) in enumerate(zip(rewards, states)):
            if status != "error" and reward is not None and math.isfinite(reward) and reward > best:
                best, where = reward, (r, k)
    return where


def check_template_parser() -> HfArgumentParser:
    parser = HfArgumentParser([CheckTemplateArgs], prog="hf-rollouts check-template")
    parser.add_argument("model", help="'tiny', or a model id / path whose tokenizer's chat template to check.")
    return parser


def cmd_check_template(argv: list[str]) -> int:
    args, ns = check_template_parser().parse_args_into_dataclasses(argv)
    from .chat import check_chat_template

    if ns.model == "tiny":
        from .tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
    else:
        from transformers import AutoTokenizer

        from .agents.loading import check_local_model

        check_local_model(ns.model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(ns.model, trust_remote_code=args.trust_remote_code)
        except OSError as exc:  # no such Hub id offline, no tokenizer files
            raise UsageError(f"{ns.model}: cannot load its tokenizer: {exc}") from exc
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    report = check_chat_template(tokenizer, **_json_dict(args.chat_template_kwargs, "--chat-template-kwargs"))
    print(f"chat template of {ns.model}:")
    print(report)
    return 0 if report.ok else 1


COMMANDS = {"tasks": cmd_tasks, "generate": cmd_generate, "inspect": cmd_inspect, "check-template": cmd_check_template}
COMMANDS["view"] = run_view  # hf_rollouts.viewer.command

COMMANDS["train"] = run_train  # hf_rollouts.cli_train (the training stack is imported when it runs)
PARSERS = {"tasks": tasks_parser, "generate": generate_parser, "inspect": inspect_parser}
PARSERS |= {"check-template": check_template_parser, "view": view_parser, "train": train_parser}
"""Each command's argument parser (what ``hf-rollouts COMMAND --help`` prints); the docs' commands are checked
against them (tests/test_docs.py)."""
USAGE = """usage: hf-rollouts {tasks,generate,inspect,check-template,view,train} [options]

  tasks           write a task dataset for an environment
  generate        play episodes and write a rollout dataset (+ parquet, card; optional Hub push)
  inspect         print a rollout dataset's statistics and one trajectory
  check-template  check a model's chat template against hf_rollouts' delta rendering (exit 1 on a defect)
  view            look at a rollout dataset in a local web viewer (--html writes one self-contained page)
  train           a GRPO run from a YAML or TOML config file (--dry-run: check it and print the plan)

Run `hf-rollouts COMMAND --help` for a command's options. Errors are one `error:` line (exit code 2: fix the command
or its input; 1: the run failed); add --debug (anywhere) for the traceback."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"error: unknown command {argv[0]!r}.\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return command(argv[1:])
    except Exception as exc:
        code = 2 if isinstance(exc, user_errors()) else 1 if isinstance(exc, run_failures()) else None
        if debug or code is None:  # a bug, or asked for: the traceback
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
