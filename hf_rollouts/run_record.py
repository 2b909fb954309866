"""The run record: what a :func:`~hf_rollouts.pipeline.generate_rollouts` run was, carried by the dataset it returns.

The pipeline knows what made its rows (the agent's fingerprint, the tokenizer and chat template, each env's class,
config and source, the options and seeds, the shard plan); a saved dataset must say so
(:mod:`hf_rollouts.provenance` builds the provenance from this record and the data). The record travels in the
dataset's :class:`~datasets.DatasetInfo` (``description``, after :data:`RUN_RECORD_PREFIX`), which ``select``,
``cast``, ``map`` and ``save_to_disk`` keep (Arrow schema metadata is dropped by each of them).

Nothing secret is recorded (:func:`scrub`): keys named like credentials are dropped, values that look like API keys
or tokens are replaced, and paths under the user's home directory are written from ``~``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetInfo
from transformers import PreTrainedTokenizerBase

from ._version import __version__
from .chat.tool_calls import template_family
from .fingerprint import canonical, tokenizer_fingerprint

RUN_RECORD_PREFIX = "hf_rollouts run record (JSON): "
"""Where the record starts in ``DatasetInfo.description`` (the rest of the description is left as it was)."""

SEED_RULE = (
    "rollout r of task row i: derive_seed(derive_seed(seed, i), 0, r); its turn k: derive_seed(that, k) "
    "(hf_rollouts.seeding.derive_seed: the first 4 bytes of sha256 of the parts joined by ':')"
)
"""How a run's request seeds follow from its seed (:func:`hf_rollouts.expansion.play_rows`)."""

SECRET_KEY = re.compile(
    r"^(?:(?:\w+[_-])?(?:api[_-]?key|secret[_-]?key|private[_-]?key|access[_-]?key|password|passwd)"
    r"|(?:(?:hf|access|auth|refresh|bearer|api|session|id|github|gh|openai|wandb)[_-])?token"
    r"|(?:client[_-])?secret|authorization|bearer|credentials?)$",
    re.IGNORECASE,
)
"""Keys whose values are never recorded: whole credential names (``api_key``, ``openai_api_key``, ``token``,
``hf_token``, ``access_token``, ``secret``, ``password``, ``authorization``...), never a name that merely ends like
one (``pad_token``, ``eos_token``, ``sort_key``: config a verify must see); ``api_key_env``, the *name* of a
variable, is kept: it holds no secret."""
SECRET_VALUE = re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{16,}|Bearer\s+\S+)")
"""Values that look like an API key or token, wherever they appear (e.g. in a URL or a spec string)."""
REDACTED = "<redacted>"


def scrub(obj: Any, home: str | None = None) -> Any:
    """``obj`` (JSON-like data) with secrets removed: values under credential-like keys (:data:`SECRET_KEY`, but for
    keys ending in ``_env`` that name an environment variable) become :data:`REDACTED`, key-like substrings
    (:data:`SECRET_VALUE`) too, and the home directory ``home`` (default ``~``'s) is written ``~``."""
    home = home if home is not None else os.path.expanduser("~")
    if isinstance(obj, dict):
        return {
            k: REDACTED if SECRET_KEY.search(str(k)) and not str(k).endswith("_env") and v else scrub(v, home)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [scrub(v, home) for v in obj]
    if isinstance(obj, str):
        text = SECRET_VALUE.sub(REDACTED, obj)
        if not home or home == "/":
            return text
        # the home directory as a whole path component only: /root/x is ~/x, /rootless/x and /x/root are not home
        return re.sub(rf"(?<![\w./~-]){re.escape(home.rstrip('/'))}(?![\w.~-])", "~", text)
    return obj


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def chat_template_record(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The tokenizer's fingerprint (vocabulary, special tokens, template), its chat template's sha256 and family."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates
        template = canonical(template)
    return {
        "fingerprint": tokenizer_fingerprint(tokenizer),
        "name": getattr(tokenizer, "name_or_path", None) or None,
        "chat_template_sha256": sha256_text(template),
        "chat_template_family": template_family(template) if template else None,
        "pad_token_id": tokenizer.pad_token_id,
    }


def env_source_files(cls: type) -> dict[str, str]:
    """``{module: sha256 of its source file}`` for every class of ``cls``'s MRO that is an env (a file that cannot be
    read is named ``"unreadable"``). Modules, not paths: a path would say where the code lives on this machine."""
    from .envs.base import MultistepEnv

    out: dict[str, str] = {}
    for klass in cls.__mro__:
        if klass is object or not issubclass(klass, MultistepEnv):
            continue
        try:
            out[klass.__module__] = hashlib.sha256(Path(inspect.getfile(klass)).read_bytes()).hexdigest()
        except (OSError, TypeError):
            out[klass.__module__] = "unreadable"
    return out


def agent_record(agent: Any, agent_fingerprint: dict[str, Any], recipe: Any) -> dict[str, Any]:
    """What made the agent's tokens: its fingerprint (model, weights probe, sampling, backend), model id or path,
    revision (when a recipe gives one), dtype (when the agent holds a torch model), its log-prob convention."""
    fp = agent_fingerprint or {}
    sampling = fp.get("sampling") if isinstance(fp.get("sampling"), dict) else {}
    model = getattr(agent, "model", None)
    dtype = None
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        dtype = str(next(iter(parameters()), None).dtype).removeprefix("torch.")
    kwargs = getattr(recipe, "kwargs", None) or {}
    convention = agent.logprob_convention() if agent is not None else None
    return {
        "class": fp.get("agent"),
        "model": fp.get("model") if isinstance(fp.get("model"), str) else getattr(agent, "name", None),
        "revision": kwargs.get("revision"),
        "spec": getattr(recipe, "spec", None),
        "weights_probe": fp.get("weights_probe"),
        "dtype": dtype,
        "backend": sampling.get("backend") or fp.get("backend"),
        "sampling": sampling or None,
        "logprob_convention": convention,
        "fingerprint": fp,
        "fingerprint_sha256": hashlib.sha256(canonical(fp).encode()).hexdigest(),
    }


def run_record(
    *,
    agent: Any,
    agent_fingerprint: dict[str, Any],
    recipe: Any,
    tokenizer: PreTrainedTokenizerBase,
    opts: Any,
    envs: Any,
    fingerprint: str,
    num_tasks: int,
) -> dict[str, Any]:
    """The record of one run (see the module docstring); ``envs`` is the run's
    :class:`~hf_rollouts.expansion.EnvCache`, ``opts`` its :class:`~hf_rollouts.expansion.RolloutOptions`."""
    env_rows = []
    for (path, config_json), env in envs.items():
        env_rows.append(
            {
                "class": path,
                "config": json.loads(config_json),
                "fingerprint": env.fingerprint(),
                "source_files": env_source_files(type(env)),
            }
        )
    options = {f.name: getattr(opts, f.name) for f in fields(opts)}
    num_shards = -(-num_tasks // opts.shard_size)
    record = {
        "hf_rollouts": __version__,
        "run_fingerprint": fingerprint,
        "agent": agent_record(agent, agent_fingerprint, recipe),
        "tokenizer": chat_template_record(tokenizer),
        "envs": env_rows,
        "options": options,
        "seeds": {"run_seed": opts.seed, "rule": SEED_RULE},
        "shards": {"shard_size": opts.shard_size, "num_shards": num_shards, "tasks": num_tasks},
    }
    return scrub(json.loads(canonical(record)))


def with_run_record(ds: Dataset, record: dict[str, Any]) -> Dataset:
    """``ds`` carrying ``record`` in its info (an earlier record there is replaced)."""
    info = ds.info.copy()
    before = (info.description or "").split(RUN_RECORD_PREFIX)[0]
    info.description = before + RUN_RECORD_PREFIX + json.dumps(record, sort_keys=True)
    return Dataset(ds.data, info=info, split=ds.split, fingerprint=ds._fingerprint)


def read_run_record(ds: Dataset | DatasetInfo) -> dict[str, Any] | None:
    """The run record ``ds`` carries, or ``None`` (not made by :func:`~hf_rollouts.pipeline.generate_rollouts`)."""
    info = ds.info if isinstance(ds, Dataset) else ds
    text = info.description or ""
    if RUN_RECORD_PREFIX not in text:
        return None
    try:
        return json.loads(text.split(RUN_RECORD_PREFIX, 1)[1])
    except ValueError:
        return None


__all__ = [
    "RUN_RECORD_PREFIX",
    "SEED_RULE",
    "agent_record",
    "chat_template_record",
    "env_source_files",
    "read_run_record",
    "run_record",
    "scrub",
    "with_run_record",
]
