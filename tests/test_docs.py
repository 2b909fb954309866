"""The README and the documentation site (docs/) say what the code does.

* Every Python block is run by a test, or says why not. The comment line right above its fence decides:
  ``<!-- run -->`` (run here, in a fresh module, in a temporary directory), ``<!-- run by tests/FILE.py::TEST -->``
  (a named test runs it) or ``<!-- not run: REASON -->``. Every import line of every block runs all the same, and
  every ``hf_rollouts.x.y`` name on any page resolves.
* Every ``hf-rollouts ...`` command of a shell block parses with that command's own parser (``...`` stands for
  options left out and is dropped); every ``scripts/*.sh`` a block names exists; a block with any other command
  says why it is not run (``<!-- not run: REASON -->``).
* Every public name has an entry in the API reference (docs/reference/): the names in ``__all__`` of the package,
  of each subpackage, and of the user-facing modules in :data:`USER_MODULES`.

``mkdocs build --strict`` (scripts/test.sh) checks the rest: links, anchors, and that each reference entry exists.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_TEXT = (ROOT / "README.md").read_text()
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
USER_MODULES = (
    "hf_rollouts.schema",
    "hf_rollouts.envs.config",
    "hf_rollouts.envs.task_data",
    "hf_rollouts.envs.tool_env",
    "hf_rollouts.envs.check",
    "hf_rollouts.envs.adapter",
    "hf_rollouts.tools.mcp",
    "hf_rollouts.tiny_model",
    "hf_rollouts.smollm2",
)
"""Modules (not packages) whose ``__all__`` is public too: what the guides import from (an env's config and task
checks, tool envs, the conformance check, the adapter base, MCP tools, the two bundled models)."""

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*?)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(?:(?P<run>run)|run by (?P<by>\S+)|not run:\s*(?P<reason>.*?))\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the comment line above the fence ("" when there is none)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def how(self) -> re.Match[str] | None:
        return MARKER.match(self.marker)


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (indented ones too, as in lists and admonitions)."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not re.match(rf"^ *{re.escape(fence[0]) * len(fence)}{fence[0]}*\s*$", lines[end]):
            end += 1
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        lang = (opening["info"].split() or [""])[0].lstrip(".").lower()
        found.append(Block(page, i + 1, lang, code + "\n", previous.strip()))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang in PYTHON]
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL]
DOTTED = sorted({name for page in PAGES for name in re.findall(r"hf_rollouts(?:\.[A-Za-z_]\w*)+", page.read_text())})


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


def test_the_pages_have_blocks_to_check():
    assert len(PYTHON_BLOCKS) >= 5 and len(SHELL_BLOCKS) >= 3, (len(PYTHON_BLOCKS), len(SHELL_BLOCKS))
    assert any(b.page.name == "README.md" for b in PYTHON_BLOCKS) and any("docs" in b.page.parts for b in BLOCKS)


@pytest.mark.parametrize("dotted", DOTTED)
def test_every_dotted_name_the_pages_show_resolves(dotted):
    resolve(dotted)


def heading_ids(page: Path) -> set[str]:
    """The anchors of a page's headings, as mkdocs' toc makes them (lower case, punctuation dropped, ``-``
    for spaces)."""
    titles = re.findall(r"^#+ +(.+?) *$", page.read_text(), flags=re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", t.lower()).strip()) for t in titles}


def test_every_relative_link_of_the_readme_leads_somewhere():
    """mkdocs checks the site's links; the README is not part of the site, so its links into docs/ are checked here."""
    links = re.findall(r"\]\(([^)\s]+)\)", README_TEXT)
    local = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert len(local) >= 10, local
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README.md links {link}: no such file"
        if anchor:
            assert anchor in heading_ids(target), f"README.md links {link}: {path or 'README.md'} has no such heading"


# -- Python blocks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.where)
def test_every_python_block_is_run_or_says_why_not(block):
    how = block.how
    assert how, (
        f"{block.where}: say above the ```python fence whether a test runs it: `<!-- run -->`, "
        "`<!-- run by tests/FILE.py::TEST -->`, or `<!-- not run: REASON -->`"
    )
    if how["by"]:
        file, _, test = how["by"].partition("::")
        assert (ROOT / file).is_file() and f"def {test}(" in (ROOT / file).read_text(), (
            f"{block.where}: no test {how['by']} (the marker must name an existing test)"
        )
    if how["reason"] is not None:
        assert len(how["reason"].split()) >= 3, f"{block.where}: give the reason it is not run, in a few words"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.where)
def test_every_import_of_every_python_block_runs(block):
    tree = ast.parse(block.code)
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for module in [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]:
            if not (module or "").startswith("hf_rollouts"):
                pytest.importorskip(module.split(".")[0])  # third-party (trl, torch): present with the test extra
        exec(compile(ast.Module([node], type_ignores=[]), block.where, "exec"), {})


RUN_HERE = [b for b in PYTHON_BLOCKS if b.how and b.how["run"]]


@pytest.mark.parametrize("block", RUN_HERE, ids=lambda b: b.where)
def test_the_blocks_marked_run_run(block, tmp_path, monkeypatch):
    """Each runs as a module of its own (so classes it defines import by path, as in a user's script)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ROLLOUTS_CACHE", str(tmp_path / "cache"))
    name = "docs_snippet_" + re.sub(r"\W", "_", block.where)
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.code, block.where, "exec"), module.__dict__)


# -- shell blocks ----------------------------------------------------------------------------------------------


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, as argv lists (``$`` prompts: only those lines; ``VAR=x`` prefixes dropped)."""
    text = block.code.replace("\\\n", " ")
    lines = text.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    found = []
    for line in lines:
        for part in re.split(r"\s(?:&&|\|\||;)\s", line):
            argv = shlex.split(part, comments=True)
            while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                argv = argv[1:]
            if argv:
                found.append(argv)
    return found


def parse_error(argv: list[str]) -> str | None:
    """What the CLI's own parser says about ``hf-rollouts ARGS`` (``None``: it parses)."""
    from hf_rollouts import cli

    if len(argv) < 2 or argv[1] not in cli.PARSERS:
        return f"unknown command {argv[1:2]}, expected one of {sorted(cli.PARSERS)}"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cli.PARSERS[argv[1]]().parse_args([a for a in argv[2:] if a != "..."])
    except SystemExit:
        error = stderr.getvalue().strip().splitlines()[-1]
        if "..." in argv and "the following arguments are required" in error:
            return None  # an excerpt: the options it leaves out may be the required ones
        return error
    return None


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_every_shell_block_parses_or_says_why_not(block):
    others = []
    for argv in commands(block):
        if argv[0] == "hf-rollouts":
            error = parse_error(argv)
            assert error is None, f"{block.where}: `{shlex.join(argv)}` does not parse: {error}"
        else:
            scripts = [a for a in argv if re.match(r"^(\./)?scripts/[\w.-]+\.sh$", a)]
            assert all((ROOT / s).is_file() for s in scripts), f"{block.where}: no such script in {argv}"
            others.append(shlex.join(argv))
    how = block.how
    if others:
        assert how and how["reason"], (
            f"{block.where}: runs commands no test runs ({others[:3]}): say why above its fence, "
            "`<!-- not run: REASON -->`"
        )
    if how and how["reason"] is not None:
        assert len(how["reason"].split()) >= 3, f"{block.where}: give the reason it is not run, in a few words"


def test_the_parse_check_refuses_a_wrong_option():
    assert parse_error(["hf-rollouts", "generate", "--env", "mastermind", "--no-such-option", "1"])
    assert parse_error(["hf-rollouts", "generate", "--env", "mastermind", "--num-rollouts", "4"])  # no --output
    assert parse_error(["hf-rollouts", "generate", "...", "--num-rollouts", "4"]) is None
    assert parse_error(["hf-rollouts", "generate", "--env", "mastermind", "--output", "out/x"]) is None
    assert parse_error(["hf-rollouts", "no-such-command"])


# -- the API reference -----------------------------------------------------------------------------------------


def namespaces() -> list[str]:
    """Every package that declares ``__all__``, then :data:`USER_MODULES` (read from the source: nothing imported)."""
    found = []
    for init in sorted((ROOT / "hf_rollouts").rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        if any(
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets) for n in tree.body
        ):
            found.append(".".join(init.parent.relative_to(ROOT).parts))
    return found + list(USER_MODULES)


def public_names() -> list[tuple[str, str]]:
    names = []
    for namespace in namespaces():
        module = importlib.import_module(namespace)
        assert hasattr(module, "__all__"), f"{namespace} is in USER_MODULES but declares no __all__"
        names += [(namespace, name) for name in module.__all__ if not name.startswith("__")]
    return names


def reference_entries() -> dict[int, str]:
    """id(object) -> the ``::: identifier`` that documents it, over docs/reference/*.md."""
    entries, stale = {}, []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for identifier in re.findall(r"^::: *(\S+)", page.read_text(), flags=re.M):
            try:
                entries[id(resolve(identifier))] = identifier
            except (ImportError, AttributeError):
                stale.append(f"{page.name}: {identifier}")
    assert not stale, f"reference entries that name nothing (the name moved or went; fix or remove them): {stale}"
    return entries


def missing_entries(entries: dict[int, str]) -> list[str]:
    return [
        f"{ns}.{name}" for ns, name in public_names() if id(getattr(importlib.import_module(ns), name)) not in entries
    ]


def test_every_public_name_has_a_reference_entry():
    missing = missing_entries(reference_entries())
    assert not missing, (
        "public names without an entry in the API reference (add a `::: NAME` line to the page of "
        f"docs/reference/ for that part): {missing}"
    )


def test_the_reference_check_sees_a_missing_entry():
    entries = reference_entries()
    namespace, name = ("hf_rollouts.training", "grpo_loss")
    del entries[id(getattr(importlib.import_module(namespace), name))]
    assert missing_entries(entries) == ["hf_rollouts.training.grpo_loss"]
    assert len(public_names()) >= 150 and len(namespaces()) >= 25  # the rule finds the packages it should


def test_the_docs_pages_a_dataset_card_links_exist():
    from hf_rollouts.publish import card

    missing = [page for page in card.GUIDES.values() if not (ROOT / "docs" / page).is_file()]
    assert not missing, f"the dataset card links docs pages that do not exist: {missing}"
