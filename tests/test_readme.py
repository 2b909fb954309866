"""The README's Python works: every `hf_rollouts.x.y` name it shows resolves, every import line of its Python
snippets runs, and its first example (generate_rollouts next to rollout_map) runs as written."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def resolve(dotted: str) -> object:
    """Import the longest importable module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is None or not ".".join(parts[:cut]).startswith(exc.name):
                raise  # the module exists but one of its own imports is missing: a real failure
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", sorted(set(re.findall(r"hf_rollouts(?:\.[A-Za-z_]\w*)+", README))))
def test_every_dotted_name_the_readme_shows_resolves(dotted):
    resolve(dotted)


def test_the_agents_namespace_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, hf_rollouts.agents as a; before = 'hf_rollouts.agents.openai' in sys.modules; "
        "a.OpenAIChatAgent; print(before, 'hf_rollouts.agents.openai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]  # imported on first use only


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_every_import_of_every_snippet_runs(index):
    tree = ast.parse(SNIPPETS[index])
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in imports:
        if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("hf_rollouts"):
            pytest.importorskip(node.module.split(".")[0])  # third-party (trl, torch): present with the test extra
        exec(compile(ast.Module([node], type_ignores=[]), f"README snippet {index}", "exec"), {})


def test_the_first_example_runs_as_written(tmp_path, monkeypatch):
    (first,) = [s for s in SNIPPETS if "rollout_map" in s and "generate_rollouts(" in s][:1]
    monkeypatch.chdir(tmp_path)  # it saves to outputs/tq
    exec(compile(first, "README first example", "exec"), {})  # its last line asserts the map equals the run
    assert (tmp_path / "outputs" / "tq" / "state.json").is_file()
