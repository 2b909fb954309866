"""Pass counts of the verdict parsers over the judge-reply corpus (``tests/fixtures/judge_replies.json``), per parser.

A case passes when the parser gives its reward, or, for a no-verdict case, raises ``NoVerdictError`` (any reason: an
older parser's reasons differ). ``--ref REF`` reads ``VerdictParser`` from ``hf_rollouts/verify/judge.py`` at git ref
REF instead (the parser before issue 50: ``--ref 38fa66f``)::

    python scripts/judge_corpus_report.py            # this checkout
    python scripts/judge_corpus_report.py --ref 38fa66f
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hf_rollouts


def parser_class(ref: str | None) -> type:
    if ref is None:
        from hf_rollouts.verify import VerdictParser

        return VerdictParser
    source = subprocess.run(
        ["git", "show", f"{ref}:hf_rollouts/verify/judge.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("hf_rollouts.verify.judge")  # its Judge registers under the same module name
    module.__package__ = "hf_rollouts.verify"
    exec(compile(source, f"{ref}:judge.py", "exec"), module.__dict__)
    return module.VerdictParser


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default=None, help="git ref whose hf_rollouts/verify/judge.py holds the parser")
    args = ap.parse_args()
    parser_cls = parser_class(args.ref)
    cases = json.loads((ROOT / "tests" / "fixtures" / "judge_replies.json").read_text())["cases"]
    total, passed, wrong = Counter(), Counter(), []
    for case in cases:
        p = case["parser"]
        kind = p["verdict"]
        parser = parser_cls(
            kind, tuple(p.get("score_range", (0, 10))), p.get("letters", {"A": 1.0, "B": 0.0}), p.get("pattern")
        )
        total[kind] += 1
        try:
            reward = parser.parse(case["reply"])[0]
            ok = "reward" in case and math.isclose(reward, case["reward"], abs_tol=1e-6)
            got = f"{reward:.3g}"
        except Exception as exc:  # noqa: BLE001 - an older parser may raise other errors (a KeyError)
            ok = "no_verdict" in case and type(exc).__name__ == "NoVerdictError"
            got = type(exc).__name__
        passed[kind] += ok
        if not ok:
            wrong.append(f"  case {case['id']} ({kind}): got {got}, wants {case.get('reward', 'no verdict')}")
    print(f"parser at {args.ref or 'this checkout'}: {len(cases)} replies")
    for kind in sorted(total):
        print(f"  {kind:<7} {passed[kind]:>3} / {total[kind]} pass")
    print(f"  all     {sum(passed.values()):>3} / {len(cases)} pass")
    print("\n".join(wrong[:40]))


if __name__ == "__main__":
    main()
