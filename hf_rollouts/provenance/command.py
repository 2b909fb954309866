"""``hf-rollouts verify PATH``: check a rollout dataset against its provenance and replay a seeded sample.

Prints the report (:class:`~.verify.VerifyReport`): what was checked, what could not be, each mismatch, and a
one-line verdict. Exit code 0: verified; 1: a mismatch; 3: nothing wrong found but something could not be checked
(or no provenance); 2: a usage error.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser


@dataclass
class VerifyArgs:
    model: str | None = field(
        default=None,
        metadata={
            "help": "The model that made the dataset (a load_agent spec: tiny, smollm2, a path or Hub id); default: "
            "the spec the provenance records, if it is an embedded model or a local path (else --model is needed). "
            "It is loaded with the recorded sampling settings, seed and backend."
        },
    )
    sample: int = field(default=8, metadata={"help": "Task rows to replay (every rollout of each); 0: none."})
    seed: int = field(default=0, metadata={"help": "Seed of the choice of rows to replay."})
    rewards_only: bool = field(
        default=False,
        metadata={
            "help": "Play the stored agent tokens back (no model): re-derive env tokens and rewards with the recorded "
            "envs and verifiers."
        },
    )
    logprob_tolerance: float | None = field(
        default=None, metadata={"help": "Largest |stored - replayed| log-prob accepted (default: LOGPROB_TOLERANCE)."}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer id/path for --rewards-only (default: PATH/tokenizer, else --model's)."},
    )
    allow_env_module: list[str] = field(
        default_factory=list,
        metadata={"help": "Module prefix outside hf_rollouts.envs whose env classes may be imported (runs code)."},
    )
    allow_env_model: list[str] = field(
        default_factory=list, metadata={"help": "Model/endpoint spec rows may name for an env's own model."}
    )


def verify_parser() -> HfArgumentParser:
    parser = HfArgumentParser([VerifyArgs], prog="hf-rollouts verify")
    parser.add_argument("path", help="Rollout dataset: a folder written by `hf-rollouts generate`, or a Hub id.")
    return parser


def recorded_agent(provenance: dict[str, Any], model: str | None, notes: list[str] | None = None) -> Any:
    """The agent ``model`` (default: the recorded spec) loaded with the recorded sampling settings, seed, backend and
    cache: the agent whose fingerprint the run recorded, if ``model`` is the recorded model.

    Without ``model``, only a recorded spec that names an embedded model (``tiny``, ``smollm2``...) or a local path
    that exists is loaded: any other (a Hub id, a server) is the provenance's author's choice of what to download or
    call, so it needs ``--model`` (``ValueError`` says so). Recorded sampling settings this version does not know are
    left out and named in ``notes``."""
    from ..agents.loading import TINY_SPECS, load_agent
    from ..agents.sampling import SamplingConfig

    agent = ((provenance.get("run") or {}).get("agent")) or {}
    spec = model or agent.get("spec")
    if not spec:
        raise ValueError("the provenance records no load_agent spec: give --model (or --rewards-only).")
    spec = os.path.expanduser(spec)  # a recorded path under the home directory is written from ~
    if model is None and spec not in {*TINY_SPECS, "smollm2", "smollm2-tools"} and not Path(spec).exists():
        raise ValueError(
            f"the provenance records the model spec {spec!r}, which is neither an embedded model nor a local path "
            "here; verify loads no recorded Hub id or server on its own: give --model (the model that made the "
            "dataset) or --rewards-only (with PATH/tokenizer or --tokenizer)."
        )
    settings = dict(agent.get("sampling") or {})
    own = {k: settings.pop(k) for k in ("seed", "backend", "reuse_kv", "cache") if k in settings}
    known = {f.name for f in fields(SamplingConfig)}
    unknown = sorted(set(settings) - known)
    if unknown and notes is not None:
        notes.append(f"recorded sampling settings unknown to this version, left out: {', '.join(unknown)}")
    return load_agent(spec, SamplingConfig(**{k: v for k, v in settings.items() if k in known}), **own)


def _tokenizer(path: str, name: str | None) -> Any:
    from transformers import AutoTokenizer

    folder = name or (str(Path(path) / "tokenizer") if (Path(path) / "tokenizer").is_dir() else None)
    if folder is None:
        return None
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def run_verify(argv: list[str]) -> int:
    args, ns = verify_parser().parse_args_into_dataclasses(argv)
    from .record import ProvenanceError, read_provenance
    from .verify import LOGPROB_TOLERANCE, verify_rollouts

    try:
        provenance = read_provenance(ns.path)
        agent, tokenizer, notes = None, None, []
        if provenance is not None and provenance.get("run") is not None:
            if args.rewards_only:
                tokenizer = _tokenizer(ns.path, args.tokenizer)
            if not args.rewards_only or tokenizer is None:
                agent = recorded_agent(provenance, args.model, notes)
        report = verify_rollouts(
            ns.path,
            agent,
            sample=args.sample,
            seed=args.seed,
            rewards_only=args.rewards_only,
            logprob_tolerance=LOGPROB_TOLERANCE if args.logprob_tolerance is None else args.logprob_tolerance,
            tokenizer=tokenizer,
            provenance=provenance,
            allowed_env_modules=args.allow_env_module,
            allowed_env_models=args.allow_env_model,
        )
    except (ProvenanceError, FileNotFoundError, ValueError, ImportError) as exc:  # says what to fix
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    report.notes += notes
    print(report.text())
    return report.exit_code


__all__ = ["VerifyArgs", "recorded_agent", "run_verify", "verify_parser"]
