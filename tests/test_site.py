"""The built documentation site reads as promised: offline, with the module docstrings the API pages point to, with
formatted signatures and lists rendered as lists; and the addresses a dataset card links agree with mkdocs.yml and
pyproject.toml.

The site is built once here (``mkdocs build --strict``, the check scripts/test.sh relied on before: a broken link,
anchor or reference entry fails it). Where the docs extra is not installed (the lowest-versions venv), the build
tests skip.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HAVE_MKDOCS = all(importlib.util.find_spec(m) is not None for m in ("mkdocs", "material", "mkdocstrings_handlers"))
LONGEST_SIGNATURE_LINE = 250
"""Characters. A formatted signature puts one parameter a line (the longest, a default help string, is ~200); an
unformatted one is a single line of up to ~2,500."""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if not HAVE_MKDOCS:
        pytest.skip('the docs extra is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    return out


def pages(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in sorted(site.rglob("*.html"))}


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_no_page_loads_anything_from_the_network(site):
    """Offline, a script fetched from the network never arrives: material's mermaid support fetches mermaid.js from
    unpkg for any ``class="mermaid"`` element, and the search waited on it. Pictures are SVG files of the site."""
    found = pages(site)
    assert "index.html" in found and "assets/overview.svg" in {str(p.relative_to(site)) for p in site.rglob("*.svg")}
    assert '<img alt="A task dataset' in found["index.html"]
    for name, page in found.items():
        external = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(https?:)?//[^"]*"[^>]*>', page)
        assert not [tag for tag in external if "stylesheet" in tag or "<script" in tag], (name, external)
        assert 'class="mermaid"' not in page, f"{name}: a mermaid diagram (fetched from unpkg.com): draw an SVG"
        assert not re.search(r"<img\b[^>]*src=\"https?://", page), f"{name}: an image from the network"


def test_every_module_docstring_the_api_pages_mention_is_on_the_site(site):
    """Docstrings say "see the module docstring": the phrase links to that module's docstring, rendered on the same
    site (``::: MODULE`` with ``members: false``); a phrase left as plain text names a module the site does not show."""
    mentions = 0
    for name, page in pages(site).items():
        if not name.startswith("reference/"):
            continue
        mentions += len(re.findall(r"module docstring", page))
        unlinked = re.sub(r"<a\b[^>]*>.*?</a>", "", page, flags=re.S)
        modules = sorted(set(re.findall(r'<span title="([\w.]+)">(?:the )?module docstring</span>', unlinked)))
        assert "module docstring" not in unlinked, (
            f"{name}: docstrings say 'see the module docstring' but these modules' docstrings are not on the site: "
            f"{modules or 'see the page'}; add `::: MODULE` with options `members: false` and `show_root_heading: "
            "true` to the page, before the entry that points to it"
        )
    assert mentions >= 20, mentions
    envs = pages(site)["reference/envs/index.html"]
    assert 'id="hf_rollouts.envs.base"' in envs and "(step 0: the task; later steps" in text_of(envs)


def test_signatures_are_formatted_one_parameter_a_line(site):
    longest = []
    for name, page in pages(site).items():
        for signature in re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', page, flags=re.S):
            longest.append((max(map(len, text_of(signature).splitlines())), name))
    assert len(longest) >= 100 and max(longest)[0] <= LONGEST_SIGNATURE_LINE, max(longest)


def test_the_docs_extra_has_the_signature_formatter():
    """mkdocstrings formats signatures with ruff or black when one is installed, and prints one long line otherwise."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    docs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    assert any(re.match(r"(ruff|black)\b", requirement) for requirement in docs), docs


def test_lists_render_as_lists(site):
    """A Markdown list needs a blank line before it; without one its items run on inside the paragraph above."""
    for name, page in pages(site).items():
        for paragraph in re.findall(r"<p>(.*?)</p>", page, flags=re.S):
            assert not re.search(r"(^|\n)\s*[*-] \S", paragraph), (
                f"{name}: a list rendered inside a paragraph (put a blank line before it): {text_of(paragraph)[:120]}"
            )
    core = pages(site)["reference/core/index.html"]
    invariants = core[core.index("Invariants (checked by") :]
    assert invariants.index("<ul>") < invariants.index("all per-token lists have the same length")


# -- the addresses: a dataset card links the site, pyproject and mkdocs.yml name the same ------------------------


def mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_the_site_the_repository_and_the_license_are_declared_once_and_agree():
    from hf_rollouts.publish import card

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = mkdocs_config()
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert config["site_url"] == card.DOCS == urls["Documentation"] and card.DOCS.startswith("https://")
    assert config["repo_url"] == card.REPOSITORY == urls["Repository"] and card.REPOSITORY.startswith("https://")
    license_text = (ROOT / "LICENSE").read_text()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert "Apache License\n                           Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text.splitlines()) > 190


def test_the_pages_a_card_links_are_pages_of_the_site(site):
    from hf_rollouts.publish import card

    for page in card.GUIDES.values():
        url = card.page_url(page)
        assert url.startswith(card.DOCS) and url.endswith("/"), url
        assert (site / url.removeprefix(card.DOCS) / "index.html").is_file(), f"{url}: no such page on the site"
