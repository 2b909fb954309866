"""The "Writing an env" guide's complete example: its `my_envs.py`, written out as a user would save it, plays in
Python as the guide's script shows (the printed output is the one the guide shows) and from the command line with
the guide's own `hf-rollouts` line, run from the folder that holds `my_envs.py`."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guides" / "writing-an-env.md").read_text()


def block(lang: str, containing: str) -> str:
    (found,) = [b for b in re.findall(rf"```{lang}\n(.*?)```", GUIDE, flags=re.S) if containing in b]
    return found


@pytest.fixture()
def my_envs(tmp_path, monkeypatch):
    """A folder holding the guide's ``my_envs.py``, as the working directory and on the path (as for a script)."""
    (tmp_path / "my_envs.py").write_text(block("python", "class Letters(MultistepEnv)"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ROLLOUTS_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)
    yield tmp_path
    sys.modules.pop("my_envs", None)


def test_the_guides_env_plays_in_python(my_envs):
    script = block("python", "from my_envs import Letters")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(script, "the guide's script", "exec"), {"__name__": "__main__"})
    shown = block("text", "'env_class_path': 'my_envs.Letters'")
    assert printed.getvalue() == shown, "the guide shows another output than its script prints: update the guide"


def test_the_guides_command_line_runs(my_envs):
    """The guide's line as written (``PYTHONPATH=.`` makes ``my_envs`` importable), with this checkout added to the
    path after it (the tests run this tree, not an installed copy)."""
    command = block("bash", "my_envs.Letters").replace("\\\n", " ")
    argv = shlex.split(re.search(r"^PYTHONPATH=\. (hf-rollouts generate .*?)$", command, re.M)[1])
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": f".{os.pathsep}{ROOT}", "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    if not (bindir / "hf-rollouts").exists():
        argv = [sys.executable, "-c", "import sys; from hf_rollouts.cli import main; sys.exit(main())", *argv[1:]]
    run = subprocess.run(argv, cwd=my_envs, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = load_from_disk(str(my_envs / "out" / "letters"))
    assert len(out) == 4 and set(out["env_class_path"]) == {"my_envs.Letters"}
    assert all(len(statuses) == 2 and "error" not in statuses for statuses in out["statuses"])


def test_a_module_the_cli_cannot_import_is_an_error_saying_how_to_fix(tmp_path, monkeypatch, capsys):
    from hf_rollouts.cli import main

    monkeypatch.chdir(tmp_path)  # no my_envs.py here, and nothing puts this folder on the path
    argv = shlex.split(re.search(r"(generate .*?)$", block("bash", "my_envs.Letters").replace("\\\n", " "), re.M)[1])
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "cannot import module 'my_envs'" in error and "PYTHONPATH=. hf-rollouts" in error, error
