"""The README's first example (generate_rollouts next to rollout_map) runs (with the tiny model; as written, with
SmolLM2, in the slow set), the README's own env passes check_env, the getting-started page shows the same example,
and the agents namespace stays light. tests/test_docs.py checks every other block and name of the README and the
docs."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def first_example(text: str) -> str:
    (first,) = [s for s in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "rollout_map(" in s][:1]
    return first


def test_the_readme_env_passes_check_env(tokenizer):
    """The README recommends ``check_env`` next: its own 10-line env (a str state, shared safely) passes it."""
    from hf_rollouts.envs.check import check_env

    (block,) = [s for s in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "class SayWord" in s]
    namespace: dict = {"__name__": "readme_env"}
    exec(compile(block.split("\nagent = ")[0], "README SayWord", "exec"), namespace)  # the imports and the class
    report = check_env(namespace["SayWord"], tokenizer, tasks=[{"word": "cat"}, {"word": "dog"}])
    assert report.episodes == 6


def test_the_agents_namespace_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, hf_rollouts.agents as a; before = 'hf_rollouts.agents.openai' in sys.modules; "
        "a.OpenAIChatAgent; print(before, 'hf_rollouts.agents.openai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]  # imported on first use only


def test_the_getting_started_page_shows_the_readme_example():
    assert first_example((ROOT / "docs" / "getting-started.md").read_text()) == first_example(README)


def run_first_example(tmp_path, monkeypatch, model: str) -> str:
    """Run the README's first example with ``model``; return what it printed."""
    first = first_example(README)
    assert "generate_rollouts(" in first and 'load_agent("smollm2")' in first
    monkeypatch.chdir(tmp_path)  # it saves to outputs/tq
    code = first.replace('load_agent("smollm2")', f'load_agent("{model}")')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # its last line asserts the map equals the run
        exec(compile(code, f"README first example ({model})", "exec"), {})
    assert (tmp_path / "outputs" / "tq" / "state.json").is_file()
    return printed.getvalue()


def test_the_first_example_runs(tmp_path, monkeypatch):
    """The README's first example with one change, ``load_agent("tiny")`` for ``load_agent("smollm2")`` (its comment
    offers both): every other line as written, its ``mapped == rollouts`` assertion included. The example as
    written, with SmolLM2 (minutes on CPU), is the slow test below. The columns and rows it prints are the ones
    docs/getting-started.md shows (the statuses and rewards after them are the model's)."""
    printed = run_first_example(tmp_path, monkeypatch, "tiny")
    page = (ROOT / "docs" / "getting-started.md").read_text()
    shown = re.search(r"assert mapped.to_list\(\) == rollouts.to_list\(\)\n```\n.*?```text\n(.*?)```", page, re.S)[1]
    assert printed.splitlines()[:4] == shown.splitlines()[:4], "docs/getting-started.md shows other columns"


@pytest.mark.slow
def test_the_first_example_runs_as_written(tmp_path, monkeypatch):
    """Verbatim: SmolLM2 plays 8 Twenty Questions tasks x 4 rollouts twice (the run, then the map)."""
    printed = run_first_example(tmp_path, monkeypatch, "smollm2")
    page = (ROOT / "docs" / "getting-started.md").read_text()
    shown = re.search(r"assert mapped.to_list\(\) == rollouts.to_list\(\)\n```\n.*?```text\n(.*?)```", page, re.S)[1]
    assert printed == shown, "docs/getting-started.md shows another output than the example prints"
