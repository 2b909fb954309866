"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~hf_rollouts.x.Y```,
``:func:`name```) become links where the target has a reference entry, and code where it has none.

The docstrings are written for reading in an editor (RST roles, double backticks); mkdocstrings renders them as
Markdown, where a role would show as literal ``:class:`` text. Each role is resolved in the scope of the object that
carries the docstring (griffe's ``Object.resolve``), so ``:func:`install``` in a module's docstring links to that
module's ``install``. The link is an *optional* autoref: a target without a reference entry (a private helper, a
third-party name) renders as plain code instead of failing ``mkdocs build --strict``.

A docstring that says "see the module docstring" gets that phrase as a link to its module's entry (the reference
pages render the module docstring with ``::: MODULE`` and ``members: false``; tests/test_site.py checks that every
such phrase on the built site is a link).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

MODULE_DOCSTRING = re.compile(r"\b(?:the )?module docstring\b")
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`<>]+?)`")


def _full_name(obj: griffe.Object, target: str) -> str:
    if target.startswith("hf_rollouts"):
        return target
    if target.startswith("."):  # relative to the docstring's package, as in an import statement
        module = obj.module
        package = module.path if module.is_init_module else module.path.rpartition(".")[0]
        rest = target[1:]
        while rest.startswith("."):
            package, rest = package.rpartition(".")[0], rest[1:]
        return f"{package}.{rest}"
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except Exception:  # griffe raises NameResolutionError and friends: an unresolved name stays as written
        return target
    return f"{resolved}.{rest}" if rest else resolved


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        if MODULE_DOCSTRING.search(docstring.value):
            module = html.escape(obj.module.path, quote=True)
            docstring.value = MODULE_DOCSTRING.sub(
                lambda m: f'<autoref identifier="{module}" optional>{m.group(0)}</autoref>', docstring.value
            )
        if ":`" not in docstring.value:
            return

        def link(match: re.Match[str]) -> str:
            target = match["target"].strip().rstrip("()")
            shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
            identifier = html.escape(_full_name(obj, target), quote=True)
            return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'

        docstring.value = ROLE.sub(link, docstring.value)
