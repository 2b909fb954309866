"""``trl``: any TRL reward function, called exactly as TRL's ``GRPOTrainer`` calls it.

A TRL reward function is ``f(prompts, completions, **kwargs) -> list[float | None]``, one reward per completion.
``GRPOTrainer._calculate_rewards`` (trl 1.16) calls it with keyword arguments only:

* ``prompts``: the dataset's ``prompt`` values; ``completions``: the decoded completions, plain strings in the
  *standard* format, ``[{"role": "assistant", "content": text}]`` in the *conversational* one (a prompt that is a
  list of messages);
* ``completion_ids``: the completions' token ids;
* every other column of the row (``solution=[...]``, ``answer=[...]``), as lists;
* ``trainer_state``, ``log_extra(column, values)``, ``log_metric(name, value)``;

and turns a ``None`` reward into NaN: that function does not score that completion. An ``async def`` function is
awaited.

**Full marks.** A reward of at least ``full_marks`` (default 1.0, what TRL's ``accuracy_reward`` gives a right
answer) passes: no reason, ``solved`` true. Any reward below it is partial, whatever its sign: the verdict keeps the
reward and says ``"<function> gave 0.2 of 1.0"``, so ``solved`` is false and the dataset env's retries go on.

**A function that raises** makes the verdict raise :class:`RewardFunctionError`, whose message names the function's
import path, the exception and the last line of its traceback (file, line, function and source), e.g.
``reward function my_rewards.accuracy raised ValueError: cannot score 13 (my_rewards.py:12 in accuracy: raise
ValueError(...))``; the dataset env records it as the episode's ``error`` and in its ``infos``.

This verifier makes that call with a batch of one: ``prompts=[task["prompt"]]`` (the rendered prompt),
``completions=[reply]`` (or ``[[{"role": "assistant", "content": reply}]]`` when conversational),
``completion_ids=[ids]``, every other ``task_data`` key as a one-item list, ``trainer_state=None`` (there is no
trainer), and ``log_extra`` / ``log_metric`` that record into the verdict's ``info["logged"]``. ``completion_ids``
are the reply re-tokenized by the env's tokenizer (an env hook sees the reply's text, not the sampled ids), or
``None`` when no tokenizer was bound. A ``None`` reward is a 0.0 verdict with ``info["none"] = True``, which a
:class:`~hf_rollouts.verify.rubric.Rubric` counts as TRL does (0 in the weighted sum; when every component is
``None`` the episode cannot be scored and fails).

The function is named by import path (``"mypkg.rewards.my_reward"``), which is code to run: like ``env_class_path``,
a task row may name it only under the registry's trust rule (:meth:`modules_named`; ``allowed_env_modules``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import math
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..aio import THREADS
from .base import Verdict, Verifier, VerifierConfigError, register_verifier
from .checks import show_number

TRL_RESERVED = ("prompt", "completion", "completion_ids")
"""Row keys TRL does not pass on as keyword arguments (they are ``prompts``, ``completions``, ``completion_ids``)."""


def split_function_path(path: Any) -> tuple[str, str]:
    """``(module, attribute)`` of ``"pkg.module.func"``; :class:`VerifierConfigError` for anything else."""
    if not isinstance(path, str) or "." not in path or not all(p.isidentifier() for p in path.split(".")):
        raise VerifierConfigError("function", f"verifier 'trl': function must be 'package.module.func', got {path!r}.")
    module, _, name = path.rpartition(".")
    return module, name


class RewardFunctionError(RuntimeError):
    """A TRL reward function raised; the message names it by import path, with the exception and the last line of
    its traceback (:func:`raised`)."""


def raised(function: str, exc: BaseException) -> RewardFunctionError:
    """The :class:`RewardFunctionError` for ``exc`` raised by the reward function at import path ``function``: the
    exception's type and message, and where it was raised (the traceback's last frame: file, line, function, source
    line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" ({last.filename}:{last.lineno} in {last.name}" + (f": {last.line})" if last.line else ")")
    return RewardFunctionError(f"reward function {function} raised {type(exc).__name__}: {exc}{where}")


def conversational(prompt: Any) -> bool:
    """TRL's test: a prompt that is a list of ``{"role", "content"}`` messages."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


@register_verifier("trl")
@dataclass(frozen=True)
class TRLReward(Verifier):
    """A TRL reward function (``function``: its import path) as a verifier; see the module docstring.

    ``conversational``: ``None`` (default) follows the prompt, as TRL does (a list of messages is conversational);
    ``True`` makes a string prompt ``[{"role": "user", "content": prompt}]`` and the reply an assistant message.
    ``full_marks``: the reward at or above which a completion passes (``solved``); below it a reward is partial."""

    function: str
    conversational: bool | None = None
    full_marks: float = 1.0
    _func: Callable[..., Any] | None = field(default=None, init=False, repr=False, compare=False)
    _tokenizer: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        module, name = split_function_path(self.function)
        try:
            func = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise VerifierConfigError("function", f"verifier 'trl': cannot import {self.function!r} ({exc}).") from exc
        if not callable(func):
            raise VerifierConfigError("function", f"verifier 'trl': {self.function!r} is not callable.")
        if isinstance(self.full_marks, bool) or not isinstance(self.full_marks, (int, float)):
            raise VerifierConfigError(
                "full_marks", f"verifier 'trl': full_marks must be a number, got {self.full_marks!r}."
            )
        if not math.isfinite(self.full_marks):
            raise VerifierConfigError(
                "full_marks", f"verifier 'trl': full_marks must be finite, got {self.full_marks!r}."
            )
        object.__setattr__(self, "_func", func)

    @classmethod
    def modules_named(cls, options: Mapping[str, Any]) -> list[str]:
        return [split_function_path(options.get("function"))[0]]

    def options(self) -> dict[str, Any]:
        return {"function": self.function, "conversational": self.conversational, "full_marks": self.full_marks}

    def fingerprint(self) -> str:
        """The base fingerprint plus a hash of the function's source file (editing it invalidates cached rollouts)."""
        try:
            source = open(inspect.getfile(self._func), "rb").read()
        except (OSError, TypeError):
            source = self.function.encode()
        return f"{super().fingerprint()}:{hashlib.sha256(source).hexdigest()[:16]}"

    def bind(self, tokenizer: Any) -> None:
        object.__setattr__(self, "_tokenizer", tokenizer)

    def arguments(self, reply: str, task: Mapping[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the call (a batch of one), as ``GRPOTrainer._calculate_rewards`` builds them."""
        prompt = task.get("prompt")
        chat = conversational(prompt) if self.conversational is None else self.conversational
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        ids = None if self._tokenizer is None else self._tokenizer(reply, add_special_tokens=False)["input_ids"]

        def log_extra(column: str, values: list) -> None:
            logged.setdefault("extra", {})[column] = [
                v if isinstance(v, (str, int, float)) else repr(v) for v in values
            ]

        def log_metric(name: str, value: float) -> None:
            logged.setdefault("metrics", {})[name] = float(value)

        columns = {k: [v] for k, v in task.items() if k not in TRL_RESERVED}
        completion = [{"role": "assistant", "content": reply}] if chat else reply
        return {
            "prompts": [prompt],
            "completions": [completion],
            "completion_ids": [ids],
            **columns,
            "trainer_state": None,
            "log_extra": log_extra,
            "log_metric": log_metric,
        }

    def verdict(self, rewards: Any, logged: dict[str, Any]) -> Verdict:
        if not isinstance(rewards, (list, tuple)) or len(rewards) != 1:
            raise ValueError(
                f"TRL reward function {self.function!r} returned {rewards!r:.80}; it must return a list with one "
                "reward per completion (one here)."
            )
        (reward,) = rewards
        info: dict[str, Any] = {"logged": logged} if logged else {}
        if reward is None:
            return Verdict(
                0.0, f"{self.function} returned None (it does not score this completion)", {**info, "none": True}
            )
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"TRL reward function {self.function!r} returned {reward!r}, not a finite number or None.")
        if reward >= self.full_marks:
            return Verdict(float(reward), None, info)
        gave = f"{self.function} gave {show_number(float(reward))} of {show_number(float(self.full_marks))}"
        return Verdict(float(reward), gave, info)

    def call(self, kwargs: dict[str, Any]) -> Any:
        """The function called with ``kwargs``; what it raises comes back as a :class:`RewardFunctionError`."""
        try:
            return self._func(**kwargs)
        except Exception as exc:
            raise raised(self.function, exc) from exc

    async def acall(self, kwargs: dict[str, Any]) -> Any:
        """:meth:`call` of an ``async def`` function, awaited."""
        try:
            return await self._func(**kwargs)
        except Exception as exc:
            raise raised(self.function, exc) from exc

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        logged: dict[str, Any] = {}
        out = self.call(self.arguments(reply, task, logged))
        if inspect.isawaitable(out):
            raise RuntimeError(f"{self.function} is async: await ascore() instead of calling score().")
        return self.verdict(out, logged)

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """Awaits an ``async def`` function on the loop; runs a sync one on a worker thread (it may be slow, e.g.
        math-verify), so the loop is never blocked."""
        logged: dict[str, Any] = {}
        kwargs = self.arguments(reply, task, logged)
        if inspect.iscoroutinefunction(self._func):
            return self.verdict(await self.acall(kwargs), logged)
        return self.verdict(await asyncio.wrap_future(THREADS.submit(lambda: self.call(kwargs))), logged)


__all__ = ["RewardFunctionError", "TRLReward", "conversational", "raised"]
