"""The README's first example (generate_rollouts next to rollout_map) runs as written, and the getting-started page
shows the same example; the agents namespace stays light. tests/test_docs.py checks every other block and name of
the README and the docs."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_the_first_example_runs_as_written(tmp_path, monkeypatch):
    first = first_example(README)
    assert "generate_rollouts(" in first
    monkeypatch.chdir(tmp_path)  # it saves to outputs/tq
    exec(compile(first, "README first example", "exec"), {})  # its last line asserts the map equals the run
    assert (tmp_path / "outputs" / "tq" / "state.json").is_file()
