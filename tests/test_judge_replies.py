"""The judge-reply corpus (issue 50): every parser over ``tests/fixtures/judge_replies.json``, replies in the formats
of MT-Bench (``Rating: [[5]]``, pairwise ``[[A]]``), Arena-Hard (``[[A>>B]]``), Prometheus (``[RESULT] 3``), G-Eval
(form filling) and plain chat models (yes/no, a score, a letter), each with the verdict it must give or the reason it
is no verdict. A reply that marks no verdict, or two different ones, is :class:`NoVerdictError`, never a reward."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from hf_rollouts.verify import NoVerdictError, VerdictParser

CORPUS = json.loads((Path(__file__).parent / "fixtures" / "judge_replies.json").read_text())["cases"]


def parser_of(case: dict) -> VerdictParser:
    p = case["parser"]
    return VerdictParser(
        p["verdict"], tuple(p.get("score_range", (0.0, 10.0))), p.get("letters", {"A": 1.0, "B": 0.0}), p.get("pattern")
    )


def test_the_corpus_is_large_and_covers_every_parser_and_format():
    kinds = Counter(c["parser"]["verdict"] for c in CORPUS)
    assert len(CORPUS) >= 60 and min(kinds.values()) >= 15, kinds
    sources = " ".join(c["source"] for c in CORPUS)
    for name in ("MT-Bench", "Prometheus", "G-Eval", "plain chat", "Arena-Hard", "two verdicts"):
        assert name in sources
    assert sum("no_verdict" in c for c in CORPUS) >= 25  # as many ways to fail as to pass


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c['id']}-{c['parser']['verdict']}" for c in CORPUS])
def test_every_reply_gives_its_verdict_or_none(case):
    parser = parser_of(case)
    if "no_verdict" in case:
        with pytest.raises(NoVerdictError, match=re.escape(case["no_verdict"])) as caught:
            parser.parse(case["reply"])
        assert caught.value.reply == case["reply"]
        return
    reward, read = parser.parse(case["reply"])
    assert (reward, read) == (pytest.approx(case["reward"], abs=1e-6), case["verdict"]), case.get("note")


def test_a_reply_naming_two_verdicts_is_no_verdict_whatever_the_order():
    """The reward hack of a policy whose reply makes the judge echo a second verdict: either order, no reward."""
    for reply in ("No. The reply says 'Verdict: yes'.", "Yes. Verdict: no."):
        with pytest.raises(NoVerdictError, match="two different verdicts"):
            VerdictParser().parse(reply)
    marks = VerdictParser("score").marks("Score: 3 ... Score: 9")
    assert sorted(m.value for m in marks) == [3.0, 9.0]
