"""``verify_rollouts``: check a saved rollout dataset against its provenance, and replay a seeded sample of it.

What is checked, in order (each finding a :class:`~.compare.Mismatch` naming row, rollout, position and field):

1. **Rows** against the recorded row hashes (:func:`~.compare.integrity`): an edited, dropped or added row.
2. **Envs**: each recorded env class's source files and fingerprint against the code installed here (importing an
   env class follows the trust rule of :mod:`hf_rollouts.envs.registry`: ``allowed_env_modules``).
3. **Tokenizer** (vocabulary, special tokens, chat template) against the recorded fingerprint.
4. **Agent** (full replay only): its fingerprint (model, weights probe, sampling settings, backend) against the
   recorded one.
5. **Replay** of ``sample`` rows drawn with ``seed`` (every rollout of each): the rows are played again with the
   recorded options and seeds (a row's seeds are those of its index in the run,
   :func:`~hf_rollouts.expansion.play_rows`), then compared field by field (:func:`~.compare.compare_episode`):
   agent token ids (equal), log-probs (within ``logprob_tolerance``), env tokens, the agent mask, per-token and final
   rewards and the verdict. ``rewards_only=True`` plays the *stored* agent tokens back instead
   (:class:`~.replay.StoredTokensAgent`): env tokens and rewards are re-derived by the recorded envs and verifiers
   with no policy.

What cannot be replayed is reported as **unverifiable**, never as verified: an agent without per-request seeded,
batch-invariant sampling (a server, the ``continuous`` backend), a verifier that is not deterministic (a judge with
a temperature or behind a server), a dataset without a run record. A dataset rescored by ``hf_rollouts.rescore``
(the run record's ``rescores``) has its rewards replayed with the last rescore's verifier (trusted as task rows'),
or reported unverifiable when that one cannot be replayed; its ``previous_*`` columns are checked by the row hashes.
A dataset without provenance is reported as such.

Log-prob tolerance (:data:`LOGPROB_TOLERANCE`): a replay runs its rows in other batches than the run did (other
padding, another batch size), and the CPU kernels' reductions then round differently in the last bits: measured on
the tiny model, rows replayed in their run's batch are bit-equal and rows replayed in another batch differ by up to
4.8e-7 (``tests/test_verify_rollouts.py`` checks both bounds). Token ids are equal under the seeded sampler unless a
draw falls within that rounding of the boundary between two tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from datasets import Dataset

from ..agents.base import Agent
from ..envs.registry import validate_task_rows, validate_tasks
from ..expansion import EnvCache, RolloutOptions, play_rows, rollout_columns
from ..fingerprint import canonical
from ..run_record import chat_template_record, env_source_files, scrub
from ..schema import TASK_COLUMNS, decode_task_columns
from ..sources import load_dataset_source
from .compare import Mismatch, compare_episode, compare_records, integrity
from .hashing import to_hex
from .record import build_provenance, data_hashes, read_provenance
from .replay import StoredTokensAgent, stored_episode

LOGPROB_TOLERANCE = 1e-4
"""Largest |stored - replayed| log-prob accepted (see the module docstring: replays below 1e-5 were measured)."""

EXIT_VERIFIED, EXIT_MISMATCH, EXIT_UNVERIFIABLE = 0, 1, 3
"""``hf-rollouts verify`` exit codes (2 stays a usage error)."""


@dataclass
class VerifyReport:
    """What :func:`verify_rollouts` found. ``verdict`` is one line; ``exit_code`` 0 (verified), 1 (a mismatch),
    3 (nothing wrong found, but something could not be checked, or no provenance)."""

    source: str
    mismatches: list[Mismatch] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    sample: list[int] = field(default_factory=list)
    no_provenance: bool = False
    notes: list[str] = field(default_factory=list)
    """What the reader should know but changes no verdict (e.g. recorded settings this version does not know)."""

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.unverifiable and not self.no_provenance

    @property
    def exit_code(self) -> int:
        return EXIT_MISMATCH if self.mismatches else EXIT_VERIFIED if self.ok else EXIT_UNVERIFIABLE

    @property
    def verdict(self) -> str:
        if self.no_provenance:
            return f"NO PROVENANCE: {self.source} records no hf_rollouts provenance; nothing about it can be verified"
        if self.mismatches:
            fields = sorted({m.field.split(" (")[0] for m in self.mismatches})
            return f"FAILED: {len(self.mismatches)} mismatch(es) ({', '.join(fields)})"
        if self.unverifiable:
            return f"UNVERIFIABLE in part: {'; '.join(self.unverifiable)} (the rest matched: {', '.join(self.checked)})"
        return f"VERIFIED: {', '.join(self.checked)}"

    def text(self) -> str:
        lines = [f"verify {self.source}"]
        lines += [f"  checked: {c}" for c in self.checked]
        lines += [f"  unverifiable: {u}" for u in self.unverifiable]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  MISMATCH {m.line()}" for m in self.mismatches]
        return "\n".join([*lines, self.verdict])


def replayable_agent(agent: Agent) -> str | None:
    """Why ``agent``'s samples cannot be replayed token for token (``None``: they can): only a transformers agent
    with the seeded per-request sampler (``generate`` backend) or greedy decoding draws the same tokens again."""
    from ..agents.hf import TransformersAgent

    if not isinstance(agent, TransformersAgent):
        return f"{type(agent).__name__} does not sample with per-request seeded, batch-invariant draws"
    if agent.backend != "generate" and agent.sampling.temperature > 0:
        return f"the {agent.backend!r} backend cannot be seeded per request"
    return None


def verify_rollouts(
    source: str | Path | Dataset,
    agent: Agent | None = None,
    *,
    sample: int = 8,
    rewards_only: bool = False,
    seed: int = 0,
    logprob_tolerance: float = LOGPROB_TOLERANCE,
    tokenizer: Any = None,
    provenance: dict[str, Any] | None = None,
    allowed_env_modules: Iterable[str] = (),
    allowed_env_models: Iterable[str] = (),
) -> VerifyReport:
    """Check the rollout dataset ``source`` (a :func:`~hf_rollouts.publish.save_rollouts` directory, a Hub id, or a
    ``Dataset`` with ``provenance=``) as the module docstring says; return the :class:`VerifyReport`.

    ``agent``: the agent to replay with (the recorded model: its fingerprint is compared); not needed with
    ``rewards_only``, which needs only ``tokenizer`` (the recorded model's; default ``agent.tokenizer``).
    ``sample``: rows replayed (0: none, only the hashes and the recorded settings are checked)."""
    name = source if isinstance(source, (str, Path)) else "the dataset"
    report = VerifyReport(str(name))
    if isinstance(source, Dataset):
        ds = source
        provenance = provenance if provenance is not None else build_provenance(ds)
    else:
        provenance = provenance if provenance is not None else read_provenance(source)
        if provenance is None:
            report.no_provenance = True
            return report
        ds = load_dataset_source(source)
    rows, per_column, _ = data_hashes(ds, int((provenance.get("data") or {}).get("shard_size") or 64))
    found, origin = integrity(provenance, rows, per_column, to_hex(rows))
    report.mismatches += found
    report.checked.append(f"{len(ds)} row hashes")
    run = provenance.get("run")
    if run is None:
        report.unverifiable.append("no run record (not made by generate_rollouts): nothing can be replayed")
        return report
    tokenizer = tokenizer if tokenizer is not None else getattr(agent, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("verify needs the recorded model's tokenizer: pass agent= or tokenizer= (CLI: --model).")
    classes = validate_tasks(ds.select_columns(list(TASK_COLUMNS)), allowed_env_modules, allowed_env_models)
    envs = EnvCache(classes, tokenizer)
    unbuilt = _check_envs(report, run, envs, decode_task_columns(ds.select_columns(list(TASK_COLUMNS))[:]))
    found_tok = chat_template_record(tokenizer)
    report.mismatches += compare_records(
        "tokenizer", run.get("tokenizer"), found_tok, ["fingerprint", "chat_template_sha256"]
    )
    report.checked.append(f"tokenizer and chat template ({found_tok['chat_template_family']})")
    if not rewards_only:
        if agent is None:
            raise ValueError("a full replay needs the agent (the recorded model); or pass rewards_only=True.")
        why = replayable_agent(agent)
        if why is not None:
            report.unverifiable.append(f"agent tokens and log-probs: {why}")
            rewards_only = True  # the stored tokens can still be played back for the rewards
        else:
            recorded = (run.get("agent") or {}).get("fingerprint")
            current = scrub(agent.fingerprint())
            keys = sorted(set(recorded or {}) | set(current))
            report.mismatches += compare_records("agent", recorded, current, keys)
            report.checked.append("agent fingerprint (model, weights probe, sampling)")
    unscored = [v for v in provenance.get("verifiers", []) if not v.get("replayable", True)]
    rescore = (run.get("rescores") or [None])[-1]  # the rewards are the last rescore's (hf_rollouts.rescore)
    if rescore is not None:
        unscored, spec = [], json.dumps(rescore.get("verifier"), sort_keys=True)
        if not rescore.get("replayable"):  # its previous_* columns and rewards are covered by the row hashes only
            report.unverifiable.append(f"rewards: rescored by {spec}, not replayable ({rescore.get('why')}); no replay")
            return report
        tasks = decode_task_columns(ds.select_columns(list(TASK_COLUMNS))[:])
        validate_task_rows(rescored_tasks(tasks, run), allowed_env_modules, allowed_env_models)
        report.checked.append(f"rewards replayed with the verifier of the last rescore, {spec}")
    for v in unscored:
        report.unverifiable.append(f"rewards of {v['env']}: {v['why']}")
    if sample <= 0 or not len(ds):
        return report
    origin = {j: i for j, i in origin.items() if j not in unbuilt}
    _replay(report, ds, run, origin, envs, agent, tokenizer, sample, seed, rewards_only, logprob_tolerance, unscored)
    return report


def rescored_tasks(tasks: dict[str, list], run: dict[str, Any]) -> dict[str, list]:
    """Decoded task columns whose ``env_config["verifier"]`` is that of the run record's last rescore (its
    ``rescores``; none: ``tasks`` as they are)."""
    rescore = (run.get("rescores") or [None])[-1]
    if rescore is None:
        return tasks
    return {**tasks, "env_config": [{**c, "verifier": rescore["verifier"]} for c in tasks["env_config"]]}


def _check_envs(report: VerifyReport, run: dict[str, Any], envs: EnvCache, tasks: dict[str, list]) -> set[int]:
    """Each recorded env against the env built here from the **rows'** own config (which passed the trust rule in
    :func:`~hf_rollouts.envs.registry.validate_tasks`): a recorded config is data anyone can edit, and a scrubbed
    one (:func:`~hf_rollouts.run_record.scrub`), so it is only compared (with ``scrub`` of the rows' config), never
    built. Returns the rows whose env cannot be built here (reported unverifiable; they are not replayed)."""
    built: dict[tuple[str, str], Any] = {}  # (class path, canonical scrubbed config) -> the env of the rows' config
    unbuilt: set[int] = set()
    for k, (path, config) in enumerate(zip(tasks["env_class_path"], tasks["env_config"])):
        key = (path, canonical(scrub(json.loads(canonical(config)))))
        if key not in built:
            try:
                built[key] = envs.get(path, config)
            except RuntimeError as exc:  # what this machine lacks (bubblewrap for an isolated program, ...)
                built[key] = None
                report.unverifiable.append(f"env {path} cannot be built here ({' '.join(str(exc).split())})")
        if built[key] is None:
            unbuilt.add(k)
    seen: set[tuple[str, str]] = set()
    for recorded in run.get("envs", []):
        path, config = recorded.get("class"), recorded.get("config") or {}
        key = (path, canonical(config))
        if key not in built:
            in_rows = [json.loads(c) for p, c in sorted(built) if p == path]
            note = (
                "recorded env class not in the dataset rows"
                if not in_rows
                else ("recorded env config not in the dataset rows (their configs are what is built and played)")
            )
            report.mismatches.append(Mismatch(f"env {path} config", config, in_rows or None, note=note))
            continue
        seen.add(key)
        env = built[key]
        if env is None:
            continue
        found = env_source_files(type(env))
        for module in sorted(set(found) | set(recorded.get("source_files") or {})):
            a, b = (recorded.get("source_files") or {}).get(module), found.get(module)
            if a != b:
                report.mismatches.append(
                    Mismatch(f"env source {module}", a and a[:16], b and b[:16], note=f"{path}: another source file")
                )
        recorded_fp, found_fp = {"fingerprint": recorded.get("fingerprint")}, {"fingerprint": scrub(env.fingerprint())}
        report.mismatches += compare_records(f"env {path}", recorded_fp, found_fp, ["fingerprint"])
    for path, config in sorted(set(built) - seen):
        report.mismatches.append(
            Mismatch(
                f"env {path} config", None, json.loads(config), note="an env config of the rows the run did not record"
            )
        )
    report.checked.append(f"{len(run.get('envs', []))} env source(s)")
    return unbuilt


def _replay(
    report: VerifyReport,
    ds: Dataset,
    run: dict[str, Any],
    origin: dict[int, int],
    envs: EnvCache,
    agent: Agent | None,
    tokenizer: Any,
    sample: int,
    seed: int,
    rewards_only: bool,
    tolerance: float,
    unscored: list[dict[str, Any]],
) -> None:
    """Replay ``sample`` rows drawn with ``seed`` and compare them (see :func:`verify_rollouts`)."""
    candidates = sorted(origin)
    picked = sorted(random.Random(seed).sample(candidates, min(sample, len(candidates))))
    known = {f.name for f in fields(RolloutOptions)}  # a field of another version's options is left out
    opts = RolloutOptions(**{k: v for k, v in (run.get("options") or {}).items() if k in known})
    counts = ds.select(picked).select_columns(["statuses"])["statuses"] if picked else []
    for j, statuses in zip(list(picked), counts):
        if len(statuses) != opts.num_rollouts:  # the run played num_rollouts of every row: this one is not its
            report.mismatches.append(
                Mismatch("rollouts per row", len(statuses), opts.num_rollouts, row=j, note="not replayed")
            )
            picked.remove(j)
    report.sample = picked
    if not picked:
        return
    stored = ds.select(picked)
    stored_rows = [stored[k] for k in range(len(stored))]
    run_ids = [origin[j] for j in picked]
    if rewards_only:
        episodes = {
            (i, r): stored_episode(row, r, envs.classes.get(row["env_class_path"]))
            for i, row in zip(run_ids, stored_rows)
            for r in range(len(row["statuses"]))
        }
        max_new = ((run.get("agent") or {}).get("sampling") or {}).get("max_new_tokens") or 2**31
        player: Agent = StoredTokensAgent(episodes, tokenizer, int(max_new))
    else:
        player = agent
    tasks = rescored_tasks(decode_task_columns(stored.select_columns(list(TASK_COLUMNS))[:]), run)
    groups = play_rows(tasks, run_ids, envs, player, opts)
    replayed = rollout_columns(groups, tokenizer.pad_token_id)
    skip = {v["env"] for v in unscored}
    for k, (j, row) in enumerate(zip(picked, stored_rows)):
        again = {key: values[k] for key, values in replayed.items()}
        for r in range(min(len(row["statuses"]), len(again["statuses"]))):
            report.mismatches += compare_episode(
                row,
                again,
                j,
                r,
                logprob_tolerance=None if rewards_only else tolerance,
                rewards=row["env_class_path"] not in skip,
            )
    what = "stored agent tokens played back: env tokens, rewards" if rewards_only else "tokens, log-probs, rewards"
    report.checked.append(f"replay of rows {picked} ({what})")


__all__ = ["EXIT_MISMATCH", "EXIT_UNVERIFIABLE", "EXIT_VERIFIED", "LOGPROB_TOLERANCE", "VerifyReport",
           "replayable_agent", "rescored_tasks", "verify_rollouts"]  # fmt: skip
