"""Vendor math-verify's own (gold, prediction, expected) test cases into tests/fixtures/math_verify_cases.json.

    python scripts/vendor_math_verify_cases.py /path/to/Math-Verify   # a checkout, or a bare git dir (read at HEAD)

Reads every ``tests/test_*.py`` of huggingface/Math-Verify with ``ast`` and collects each case that compares a gold
answer with a prediction through math-verify's public API: the ``@pytest.mark.parametrize`` cases of a test whose
body calls ``compare_strings(gold, pred, ...)`` (tests/test_all.py's helper: ``parse`` with
``LatexExtractionConfig(boxed_match_priority=0)`` and/or ``ExprExtractionConfig()``, then ``verify``) or
``verify(parse(gold), parse(pred))``, and the literal ``compare_strings(...) == N`` asserts of a test without
parameters. Each case keeps its file, function and position, and the settings its test passes (``match_types``,
``precision``, ``strict``, ``allow_set_relation_comp``). Tests of math-verify's internals (``sympy_expr_eq`` on
sympy objects, string extraction, mocked timeouts and errors, normalization configs) compare no gold with a
prediction; they are listed under ``skipped_tests`` with the reason.

Each case is then run through the *installed* math-verify exactly as its test runs it; ``installed_passes`` records
whether the installed version gives the expected result (cases it fails are kept, marked, and left out of the
verifier's test). ``with_latex_and_expr`` is what the installed math-verify gives for the case with the extraction
configs of the ``math`` verifier (``LatexExtractionConfig(boxed_match_priority=0)`` and ``ExprExtractionConfig()``,
both sides; the case's own ``verify`` settings): the same as ``expected`` except where the test extracts LaTeX only
or plain expressions only. The parametrize lists are evaluated with only ``math`` in scope (one case is an f-string of
``math.sqrt(17)``).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
from importlib.metadata import version
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "math_verify_cases.json"
REPO = "https://github.com/huggingface/Math-Verify"
WHY = {  # the tests that compare no gold with a prediction, and what they check instead
    "tests/test_configs.py": "parse() alone under extraction configs (boxed priority, normalization)",
    "tests/test_raise_on_error.py": "verify() on sympy objects with a mocked internal error",
    "tests/test_string_extraction.py": "StringExtractionConfig (multiple-choice letters), which the math verifier "
    "does not use",
    "tests/test_timeout.py": "math-verify's signal-based limits with mocked delays (they are off in the math "
    "verifier; its own limit is tested in tests/test_verify.py)",
}
DEFAULTS = {"match_types": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}


def read_sources(path: Path) -> tuple[str, dict[str, str]]:
    """``(commit, {relative path: source})`` of the tests of a checkout or a bare git directory."""
    git = ["git", "-C", str(path)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD", "tests/"], capture_output=True, text=True, check=True
    ).stdout.split()
    sources = {}
    for name in sorted(names):
        if Path(name).name.startswith("test_") and name.endswith(".py"):
            sources[name] = subprocess.run(
                [*git, "show", f"HEAD:{name}"], capture_output=True, text=True, check=True
            ).stdout
    return commit, sources


def literal(node: ast.expr) -> object:
    return eval(compile(ast.Expression(node), "<case>", "eval"), {"__builtins__": {}, "math": math})  # noqa: S307


def call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    return None


def comparison_call(func: ast.FunctionDef) -> ast.Call | None:
    """The test's ``compare_strings(...)`` or ``verify(parse(...), parse(...))`` call, if it has one."""
    for node in ast.walk(func):
        if call_name(node) == "compare_strings":
            return node
        if call_name(node) == "verify" and all(call_name(a) == "parse" for a in node.args[:2]) and node.args:
            return node
    return None


def settings(call: ast.Call, params: dict[str, object]) -> dict[str, object]:
    """The case's settings: the call's keywords, a parameter name read from the case."""
    if call_name(call) == "verify":  # verify(parse(gold), parse(pred)): math-verify's default configs
        return {"api": "verify(parse(gold), parse(pred))"}
    out: dict[str, object] = {"api": "compare_strings", **DEFAULTS}
    for kw in call.keywords:
        out[kw.arg] = params[kw.value.id] if isinstance(kw.value, ast.Name) else literal(kw.value)
    return out


def cases_of(path: str, source: str) -> tuple[list[dict], list[dict]]:
    cases, skipped = [], []
    for func in ast.parse(source).body:
        if not (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")):
            continue
        call = comparison_call(func)
        marks = [d for d in func.decorator_list if isinstance(d, ast.Call) and call_name(d) == "parametrize"]
        if call is None:
            why = WHY.get(path, "compares no gold with a prediction")
            skipped.append({"file": path, "function": func.name, "why": why})
            continue
        if marks:
            names = [n.strip() for n in literal(marks[0].args[0]).split(",")]
            for index, values in enumerate(literal(marks[0].args[1])):
                params = dict(zip(names, values, strict=True))
                expected = params.get("expected", params.get("result"))
                case = {"file": path, "function": func.name, "index": index}
                case |= {"gold": params["gold"], "pred": params["pred"], "expected": int(expected)}
                cases.append(case | settings(call, params))
            continue
        index = 0  # literal asserts: compare_strings("gold", "pred", ...) == N
        for node in ast.walk(func):
            if isinstance(node, ast.Compare) and call_name(node.left) == "compare_strings":
                gold, pred = (literal(a) for a in node.left.args[:2])
                case = {"file": path, "function": func.name, "index": index, "gold": gold, "pred": pred}
                cases.append(case | {"expected": int(literal(node.comparators[0]))} | settings(node.left, {}))
                index += 1
        if index == 0:
            skipped.append({"file": path, "function": func.name, "why": "no literal compare_strings assert"})
    return cases, skipped


def installed_result(case: dict, match_types: list[str] | None = None) -> int:
    """What the installed math-verify gives for ``case``, called as its own test calls it (``match_types``: with
    these extraction configs instead of the test's)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case["api"] != "compare_strings" and match_types is None:
        return int(verify(parse(case["gold"]), parse(case["pred"])))
    targets = [
        LatexExtractionConfig(boxed_match_priority=0) if t == "latex" else ExprExtractionConfig()
        for t in match_types or case["match_types"]
    ]
    return int(
        verify(
            parse(case["gold"], targets),
            parse(case["pred"], targets),
            float_rounding=case.get("precision", 6),
            strict=case.get("strict", True),
            allow_set_relation_comp=case.get("allow_set_relation_comp", False),
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="a Math-Verify checkout or bare git directory")
    args = parser.parse_args()
    commit, sources = read_sources(args.repo)
    cases, skipped = [], []
    for path, source in sources.items():
        found, left = cases_of(path, source)
        cases += found
        skipped += left
    for case in cases:
        case["installed_passes"] = installed_result(case) == case["expected"]
        case["with_latex_and_expr"] = installed_result(case, ["latex", "expr"])
    fixture = {
        "source": f"{REPO} at {commit} (tests/; the Apache-2.0/MIT-licensed test data of math-verify's authors)",
        "math_verify_version": version("math-verify"),
        "made_by": "scripts/vendor_math_verify_cases.py",
        "cases": cases,
        "skipped_tests": skipped,
    }
    lines = ",\n".join(f"  {json.dumps(c, ensure_ascii=False)}" for c in cases)  # one case a line: readable diffs
    head = json.dumps({k: v for k, v in fixture.items() if k != "cases"}, indent=1, ensure_ascii=False)
    OUT.write_text(f'{head[:-2]},\n "cases": [\n{lines}\n ]\n}}\n')
    assert json.loads(OUT.read_text()) == fixture
    passing = sum(c["installed_passes"] for c in cases)
    print(
        f"{len(cases)} cases from {len(sources)} files; math-verify {fixture['math_verify_version']} passes {passing}"
    )
    other = [c for c in cases if c["with_latex_and_expr"] != c["expected"]]
    print(f"{len(other)} give another result with LaTeX and plain expressions both extracted: {other}")
    print(f"{len(skipped)} tests compare no gold with a prediction: {[s['function'] for s in skipped]}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
