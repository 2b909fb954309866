"""``rescore_rollouts``: score saved rollouts again with another verifier or rubric, without running the policy.

Each rollout's last agent reply (the last ``assistant`` message of its conversation) is scored by the new verifier as
the :class:`~hf_rollouts.envs.dataset.DatasetEnv` of its row scores a try: the row's extraction
(``env_config["extraction"]``, ...) takes the answer, the task is the row's ``task_data`` with its prompt rendered,
and the reward is the verdict's times ``retry_discount ** (try - 1)`` (the try the stored reply was). The token
columns are never touched: only the scores change.

**Replaced**, per rollout: ``final_rewards``, ``padded_per_token_rewards`` (the new reward on the last agent turn's
tokens, by the row's ``reward_placement``; 0 elsewhere), ``solved`` (the verdict passed), ``infos`` (the dataset env's
``answer``, ``reward``, ``reason``, ``components``, ``try``, ``solved``), ``statuses`` and ``errors``. **Kept**: the
old values of those columns under ``keep_prefix`` (``previous_final_rewards``, ...); ``rescored`` (per rollout) says
which rollouts the new verifier scored.

**Which rollouts are rescored**: those whose reply the original env handed to its verifier (their ``infos`` hold a
``try``): ``done`` and ``truncated`` ones, and ``error`` ones whose error was the verifier's own (a judge's no
verdict, a reward function that raised: the reply was complete). Every other ``error`` rollout (the agent or the env
failed before a reply was scored) has no reply to score: it is kept as it was, ``rescored`` false.

**Errors of the new verifier** are recorded per rollout, never as zeros: status ``error``, the message in ``errors``
and ``infos["error"]``, ``final_rewards`` NaN, ``solved`` false.

Rows must be :class:`~hf_rollouts.envs.dataset.DatasetEnv` rows (a question, a reply, a verdict); another env's row
is refused naming it. **Trust**: what the verifier spec names is checked as a task row's ``env_config`` is: a module
to import (a ``trl`` reward function) must be in ``allowed_env_modules``, a model or endpoint (a ``judge``, a
``reward_model``) in ``allowed_env_models``, before anything is imported or loaded. Every row's task is checked by the
new verifier (a missing reference field) before any scoring.

**Recorded**: the run record the rollouts carry (:mod:`hf_rollouts.run_record`) gets a ``rescores`` entry
(:func:`rescore_entry`), so that ``hf-rollouts verify`` replays the new rewards with this verifier, or reports them
unverifiable when it cannot replay them. A reply on which the row's ``extraction_pattern`` backtracks past its timeout
is an error of that rollout (:class:`~hf_rollouts.envs.dataset.env.ExtractionTimeout`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from datasets import Dataset, Features, List, Value

from ..aio import ENGINE_LOOP
from ..envs.dataset import DatasetEnv
from ..envs.dataset.env import DatasetConfig, ExtractionTimeout, extract_reply_answer, render_task
from ..envs.registry import resolve_env_class, validate_task_rows
from ..envs.task_data import TaskDataError
from ..provenance.record import verifier_specs
from ..run_record import read_run_record, scrub, with_run_record
from ..schema import SCORE_COLUMNS, TASK_COLUMNS, TaskValidationError, decode_task_columns, require_columns
from ..verify import Rubric, TaskFieldError, Verdict, Verifier

REPLACED = SCORE_COLUMNS
"""The rollout columns a rescore replaces (their old values kept under the prefix): :data:`~hf_rollouts.schema.
SCORE_COLUMNS`."""

DEFAULT_PREFIX = "previous_"
"""The prefix of the columns that keep the scores a rescore replaced (``previous_final_rewards``, ...)."""
RESCORED_COLUMN = "rescored"


def rubric_of(verifier: Any) -> Rubric:
    """The rubric of a verifier spec (a name, a dict, a list of them) or of a :class:`~hf_rollouts.verify.Verifier`."""
    if isinstance(verifier, Rubric):
        return verifier
    if isinstance(verifier, Verifier):
        return Rubric([(1.0, verifier)])
    return Rubric.from_specs(verifier)


def check_trust(
    tasks: dict[str, list], verifier: Any, allowed_env_modules: Iterable[str], allowed_env_models: Iterable[str]
) -> None:
    """Every row a trusted DatasetEnv row, and what a verifier spec names allowed (see the module docstring)."""
    seen: set[str] = set()
    for i, path in enumerate(tasks["env_class_path"]):
        if path not in seen:
            seen.add(path)
            check_dataset_env(resolve_env_class(path, allowed_env_modules, where=f"row {i}"), path, i)
    if isinstance(verifier, Verifier):  # built by the caller: nothing named by data
        return
    rows = {**tasks, "env_config": [{**c, "verifier": verifier} for c in tasks["env_config"]]}
    try:
        validate_task_rows(rows, allowed_env_modules, allowed_env_models)
    except TaskValidationError as exc:
        raise TaskValidationError(f"the verifier to rescore with, on {exc}") from exc


def check_dataset_env(cls: type, path: str, row: int) -> None:
    if cls is not DatasetEnv:
        raise TaskValidationError(
            f"row {row}: rescoring scores DatasetEnv rows (a question, a reply, a verdict); this row was played by "
            f"{path!r}, whose rewards come from its own rules. Select the DatasetEnv rows first."
        )


def last_reply(conversation: list[dict[str, Any]] | None) -> str | None:
    """The content of the last ``assistant`` message of a conversation (``None``: none)."""
    for message in reversed(conversation or []):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return None


def tried(info_json: str | None) -> int | None:
    """The try of the reply the original env scored (``infos["try"]``), ``None`` when it scored none."""
    if not info_json:
        return None
    try:
        info = json.loads(info_json)
    except ValueError:
        return None
    value = info.get("try") if isinstance(info, dict) else None
    return value if type(value) is int and value >= 1 else None  # a bool (True) is no try


def placed(mask: list[int], reward: float, placement: str) -> list[float]:
    """Per-token rewards: ``reward`` on the last agent turn's tokens (the last run of 1s in ``mask``), 0 elsewhere."""
    rewards = [0.0] * len(mask)
    end = next((i + 1 for i in range(len(mask) - 1, -1, -1) if mask[i]), 0)
    if end == 0 or reward == 0.0 or not math.isfinite(reward):
        return rewards
    start = end - 1
    while start > 0 and mask[start - 1]:
        start -= 1
    if placement == "last":
        rewards[end - 1] = reward
    else:
        for i in range(start, end):
            rewards[i] = reward / (end - start)
    return rewards


class Rescorer:
    """The map function of :func:`rescore_rollouts` (a batch of rows in, the new columns out)."""

    def __init__(self, rubric: Rubric, prefix: str) -> None:
        self.rubric, self.prefix = rubric, prefix

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        tasks = decode_task_columns({c: batch[c] for c in TASK_COLUMNS})
        jobs, places, timeouts = [], [], []
        out: dict[str, list] = {f"{self.prefix}{c}": list(batch[c]) for c in REPLACED}
        out |= {c: [list(v) if isinstance(v, list) else v for v in batch[c]] for c in REPLACED}
        out[RESCORED_COLUMN] = [[False] * len(r) for r in batch["final_rewards"]]
        for r, (config_json, task_data) in enumerate(zip(tasks["env_config"], tasks["task_data"])):
            config = DatasetEnv.parse_config(config_json, warn=False)
            task = render_task(config, task_data)
            for k, conversation in enumerate(batch["conversations"][r]):
                try_no, reply = tried(batch["infos"][r][k]), last_reply(conversation)
                if try_no is None or reply is None:
                    continue
                try:
                    answer = extract_reply_answer(config, reply)
                except ExtractionTimeout as exc:  # the row's pattern backtracks on this reply: an error, not a 0
                    timeouts.append((r, k, config, None, try_no, exc))
                    continue
                jobs.append(self.rubric.ascore(reply, answer, task))
                places.append((r, k, config, answer, try_no))
        verdicts = [*(ENGINE_LOOP.call(gather(jobs)) if jobs else []), *(t[-1] for t in timeouts)]
        places += [t[:-1] for t in timeouts]
        for (r, k, config, answer, try_no), verdict in zip(places, verdicts):
            out[RESCORED_COLUMN][r][k] = True
            mask = batch["padded_agent_token_mask"][r][k]
            if isinstance(verdict, BaseException):
                error = f"{type(verdict).__name__}: {verdict}"
                info = {"answer": answer, "error": error, "try": try_no, "solved": False}
                self.put(out, r, k, math.nan, [0.0] * len(mask), False, info, "error", error)
                continue
            reward = float(verdict.reward) * config.retry_discount ** (try_no - 1)
            info = {
                "answer": answer,
                "reward": verdict.reward,
                "reason": verdict.reason,
                "components": verdict.info.get("components", []),
                "try": try_no,
                "solved": verdict.passed,
            }
            status = batch["statuses"][r][k] if batch["statuses"][r][k] != "error" else "done"
            rewards = placed(mask, reward, config.reward_placement)
            self.put(out, r, k, reward, rewards, verdict.passed, info, status, None)
        return out

    @staticmethod
    def put(out, r, k, reward, rewards, solved, info, status, error) -> None:
        out["final_rewards"][r][k] = reward
        out["padded_per_token_rewards"][r][k] = rewards
        out["solved"][r][k] = solved
        out["infos"][r][k] = json.dumps(info, default=repr)
        out["statuses"][r][k] = status
        out["errors"][r][k] = error


async def gather(jobs: list) -> list[Verdict | BaseException]:
    """The verdicts awaited together on the engine's loop (a judge's or a reward model's calls batch)."""
    return await asyncio.gather(*jobs, return_exceptions=True)


def rescore_rollouts(
    rollouts: Dataset,
    verifier: Any,
    *,
    tokenizer: Any = None,
    allowed_env_modules: Iterable[str] = (),
    allowed_env_models: Iterable[str] = (),
    keep_prefix: str = DEFAULT_PREFIX,
    batch_size: int = 64,
) -> Dataset:
    """``rollouts`` scored again by ``verifier`` (see the module docstring): one ``Dataset.map``.

    Args:
        rollouts: a rollout dataset of DatasetEnv rows (``generate_rollouts``' output, or one loaded from disk).
        verifier: a verifier spec as ``env_config["verifier"]`` takes it (``"math"``, ``{"name": "judge", ...}``, a
            list: a rubric), or a :class:`~hf_rollouts.verify.Verifier` object.
        tokenizer: the rollouts' tokenizer, bound to the verifiers (a TRL reward function's ``completion_ids``);
            ``None``: none (``completion_ids`` is ``None``).
        allowed_env_modules, allowed_env_models: the trust rule for what the spec names (module prefixes; model and
            endpoint specs), as for task rows.
        keep_prefix: the prefix of the kept old columns; refused when such columns exist (a rescored dataset
            rescored again needs another prefix).
        batch_size: rows per map batch; the rollouts of a batch are scored at once (a judge or reward model batches
            them).
    """
    require_columns(rollouts, (*TASK_COLUMNS, *REPLACED, "conversations", "padded_agent_token_mask"))
    taken = [c for c in (*[f"{keep_prefix}{c}" for c in REPLACED], RESCORED_COLUMN) if c in rollouts.column_names]
    if taken and keep_prefix + "final_rewards" in taken:
        raise TaskValidationError(
            f"the rollouts already have {taken} (rescored before?); give another keep_prefix (CLI --keep-prefix), "
            f"e.g. {'rescore2_'!r}, so that no scores are lost."
        )
    if not keep_prefix or not keep_prefix.isidentifier():
        raise TaskValidationError(f"keep_prefix must start a column name, e.g. 'previous_', got {keep_prefix!r}.")
    tasks = decode_task_columns(rollouts.select_columns(list(TASK_COLUMNS))[:])
    check_trust(tasks, verifier, allowed_env_modules, allowed_env_models)
    rubric = rubric_of(verifier)
    if tokenizer is not None:
        rubric.bind(tokenizer)
    for i, (config, task_data) in enumerate(zip(tasks["env_config"], tasks["task_data"])):
        try:
            rubric.check_task(render_task(DatasetConfig.from_dict(config)[0], task_data))
        except (TaskFieldError, TaskDataError) as exc:
            raise TaskValidationError(f"row {i}, field 'task_data', key {exc.key!r}: {exc}") from exc
    features = Features(
        {
            **rollouts.features,
            **{f"{keep_prefix}{c}": rollouts.features[c] for c in REPLACED},
            RESCORED_COLUMN: List(Value("bool")),
        }
    )
    bound = None if tokenizer is None else [getattr(tokenizer, "name_or_path", None), len(tokenizer)]
    identity = json.dumps([rollouts._fingerprint, rubric.fingerprint(), keep_prefix, bound], default=repr)
    fingerprint = hashlib.sha256(identity.encode()).hexdigest()[:32]
    if taken:  # only 'rescored' from an earlier rescore with another prefix: replaced
        rollouts = rollouts.remove_columns([RESCORED_COLUMN])
    out = rollouts.map(
        Rescorer(rubric, keep_prefix),
        batched=True,
        batch_size=batch_size,
        features=features,
        new_fingerprint=fingerprint,
        desc="rescore",
    )
    record = read_run_record(rollouts)
    if record is None:  # not made by generate_rollouts: no record to carry on
        return out
    entry = rescore_entry(verifier, keep_prefix, tasks["env_config"])
    return with_run_record(out, {**record, "rescores": [*(record.get("rescores") or []), entry]})


def rescore_entry(verifier: Any, keep_prefix: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run record's entry for a rescore (appended to its ``rescores``; ``hf-rollouts verify`` replays the rewards
    with the last one's verifier): ``verifier`` (the spec, scrubbed; a verifier object's fingerprint), ``keep_prefix``,
    ``replayable`` and ``why`` not (a verifier object, a spec that held a secret, a judge that samples or sits behind
    a server, rows of several tries: a rescore scores the last try only, a replay every try)."""
    from .. import __version__

    if isinstance(verifier, (Rubric, Verifier)):
        spec, why = verifier.fingerprint(), "a verifier object built by the caller: no spec to build it again"
    else:
        spec = scrub(verifier)
        why = "its spec held a secret or a home-directory path (recorded scrubbed)" if spec != verifier else None
        why = why or verifier_specs({"envs": [{"config": {"verifier": verifier}}]})[0]["why"]
        if why is None and any(int(c.get("max_turns") or DatasetEnv.default_max_turns) > 1 for c in configs):
            why = "rows with max_turns > 1: the rescore scored each rollout's last try, a replay would score each try"
    return {
        "verifier": spec,
        "keep_prefix": keep_prefix,
        "replayable": why is None,
        "why": why,
        "hf_rollouts": __version__,
    }


def rescore_summary(ds: Dataset, prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """Counts of a rescored dataset: rollouts, rescored, errors of the new verifier, kept; mean final reward and
    solve rate before and after (NaN rewards left out)."""

    def mean(values: list) -> float:
        finite = [float(v) for v in values if v is not None and not math.isnan(v)]
        return sum(finite) / len(finite) if finite else math.nan

    def flat(column: str) -> list:
        return [v for row in ds[column] for v in row]

    rescored, statuses = flat(RESCORED_COLUMN), flat("statuses")
    errors = sum(1 for s, r in zip(statuses, rescored) if r and s == "error")
    return {
        "rollouts": len(rescored),
        "rescored": sum(rescored),
        "errors": errors,
        "kept": len(rescored) - sum(rescored),
        "mean_final_reward": mean(flat("final_rewards")),
        "previous_mean_final_reward": mean(flat(f"{prefix}final_rewards")),
        "solve_rate": mean([float(bool(s)) for s in flat("solved") if s is not None]),
        "previous_solve_rate": mean([float(bool(s)) for s in flat(f"{prefix}solved") if s is not None]),
    }


def spec_text(verifier: Any) -> str:
    """How the card names the verifier: its spec as JSON, or a verifier object's fingerprint."""
    if isinstance(verifier, Verifier):
        return verifier.fingerprint()
    return json.dumps(verifier, sort_keys=True) if not isinstance(verifier, str) else verifier


__all__ = ["DEFAULT_PREFIX", "REPLACED", "rescore_entry", "rescore_rollouts", "rescore_summary", "spec_text"]
