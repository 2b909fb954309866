"""Rescoring saved rollouts with another verifier or rubric, without running the policy: :func:`rescore_rollouts`
(a ``Dataset.map``; :mod:`.core` says what is replaced, what is kept and which rollouts are rescored) and the
``hf-rollouts rescore`` command (:mod:`.command`: the dataset written with its card saying which verifier scored it)."""

from .core import DEFAULT_PREFIX, REPLACED, rescore_rollouts, rescore_summary

__all__ = ["DEFAULT_PREFIX", "REPLACED", "rescore_rollouts", "rescore_summary"]
