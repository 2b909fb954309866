"""Verifiers: score an agent's reply against a task's reference (knows no environments and no agents).

* the contract: :class:`Verdict`, :class:`Verifier` (``score`` / ``ascore`` / ``fingerprint``), the name registry
  (:func:`register_verifier`, :func:`build_verifier`) — :mod:`.base`;
* weighted composition: :class:`Rubric` — :mod:`.rubric`;
* answer extraction (``\\boxed{}``, GSM8K's ``####``, the last number, a regex, a code block, the whole reply) —
  :mod:`.extract`;
* the shipped verifiers, by spec name: ``exact`` (:class:`ExactMatch`), ``numeric`` (:class:`Numeric`), ``format``
  (:class:`FormatRegex`), ``math`` (:class:`MathVerifier`, the optional ``math-verify`` extra) and ``trl``
  (:class:`TRLReward`: any TRL reward function, called as TRL calls it), ``code`` (:class:`CodeVerifier`: the
  reply's code against the row's tests, in the sandbox of :mod:`hf_rollouts.sandbox`);
* scored by a model: ``reward_model`` (:class:`RewardModel`: a sequence-classification reward model, as TRL's
  ``reward_funcs`` score) and ``judge`` (:class:`Judge`: an agent grades the reply, :class:`VerdictParser` reads it),
  both batched across episodes on the engine's loop (:class:`MicroBatcher`).

Environments (:class:`hf_rollouts.envs.dataset.DatasetEnv`) hold a rubric and await its ``ascore``.
"""

from .base import (
    VERIFIERS,
    TaskFieldError,
    Verdict,
    Verifier,
    VerifierConfigError,
    build_verifier,
    reference,
    register_verifier,
    split_spec,
    verifier_class,
)
from .batcher import MicroBatcher
from .checks import ExactMatch, FormatRegex, Numeric, normalize, parse_number, show_number
from .code import CodeVerifier
from .extract import EXTRACTIONS, check_extraction, code_block, extract_answer, last_boxed, last_number
from .judge import Judge, NoVerdictError, VerdictParser
from .mathverify import MathVerifier, latex_form, math_equal, math_parse
from .reward_model import RewardModel
from .rubric import Rubric, UnscorableError
from .trl_reward import RewardFunctionError, TRLReward

__all__ = [
    "EXTRACTIONS",
    "VERIFIERS",
    "CodeVerifier",
    "ExactMatch",
    "FormatRegex",
    "Judge",
    "MathVerifier",
    "MicroBatcher",
    "NoVerdictError",
    "Numeric",
    "RewardFunctionError",
    "RewardModel",
    "Rubric",
    "TRLReward",
    "TaskFieldError",
    "UnscorableError",
    "Verdict",
    "VerdictParser",
    "Verifier",
    "VerifierConfigError",
    "build_verifier",
    "check_extraction",
    "code_block",
    "extract_answer",
    "last_boxed",
    "last_number",
    "latex_form",
    "math_equal",
    "math_parse",
    "normalize",
    "parse_number",
    "reference",
    "register_verifier",
    "show_number",
    "split_spec",
    "verifier_class",
]
