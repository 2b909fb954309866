"""scripts/test.sh, what CI runs: its lowest-versions run covers every test file that drives transformers, and the
slow set stays out of the default run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_SH = (ROOT / "scripts" / "test.sh").read_text()
IMPORTS_TRANSFORMERS = re.compile(r"^\s*(?:from transformers\b|import transformers\b)", re.M)


def lowest_tests() -> list[str]:
    (listed,) = re.findall(r"^LOWEST_TESTS=\((.*?)\)", TEST_SH, flags=re.S | re.M)
    return listed.split()


def test_the_lowest_versions_run_lists_every_test_file_that_imports_transformers():
    listed = lowest_tests()
    assert listed and all((ROOT / path).is_file() for path in listed), [p for p in listed if not (ROOT / p).is_file()]
    assert '"${LOWEST_TESTS[@]}"' in TEST_SH
    drives = sorted(
        f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py") if IMPORTS_TRANSFORMERS.search(p.read_text())
    )
    missing = [path for path in drives if path not in listed]
    assert not missing, (
        f"{missing} import transformers, so their outcome can depend on its version: add them to LOWEST_TESTS in "
        "scripts/test.sh (the lowest-versions run)"
    )


def test_the_slow_set_is_left_out_by_default_and_each_slow_test_says_what_it_adds():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "addopts = \"-ra -m 'not slow'\"" in pyproject and "-m slow" not in TEST_SH.split("set -euo")[1]
    slow = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        for match in re.finditer(r"@pytest\.mark\.slow\n(?:@.*\n)*def (\w+)\(.*?\):\n\s+\"\"\"(.+?)\"\"\"", text, re.S):
            assert len(match[2].split()) >= 5, f"{path.name}::{match[1]}: say in its docstring what the slow run adds"
            slow.append(match[1])
    assert "test_the_first_example_runs_as_written" in slow, slow  # the README example with SmolLM2, verbatim
