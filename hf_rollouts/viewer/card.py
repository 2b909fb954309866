"""What the viewer reads from a dataset card (``README.md``): its YAML header, read with aliases refused, and the
provenance ``hf_rollouts`` writes in its body.

A card is data from wherever the dataset came from. YAML aliases (``*name``) let a few hundred bytes stand for
millions of nodes (an "alias bomb": each level repeats the one before); PyYAML loads such a header quickly as a graph
of shared objects, and whatever walks it (the JSON answer, a copy) expands it, for seconds and gigabytes. Cards that
``hf_rollouts`` and the Hub write use no aliases, so :func:`read_card_header` refuses them (and headers nested deeper
than :data:`MAX_DEPTH` or larger than :data:`MAX_HEADER_CHARS`) with :class:`CardHeaderError`, which the page shows.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_HEADER_CHARS = 1_000_000
"""The largest YAML header read (a card's header is a few hundred bytes to a few KB)."""
MAX_DEPTH = 64
"""The deepest nesting of a YAML header read (PyYAML composes recursively)."""


class CardHeaderError(ValueError):
    """A card's YAML header that the viewer does not read: it uses aliases, is too deep or too large, or is not
    YAML."""


HEADER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*$", re.S | re.M)
"""A card's YAML header: between a first line ``---`` and the next line ``---`` (as huggingface_hub reads it)."""


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (and with them merge keys, ``<<: *name``) and deep nesting."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise CardHeaderError(
                f"{self.what} uses an alias (*{event.anchor}, line {event.start_mark.line + 1 + self.first_line}); "
                "the viewer reads no YAML aliases (a few of them can stand for millions of nodes); write the values "
                "out."
            )
        self.nesting = getattr(self, "nesting", 0) + 1
        try:
            if self.nesting > MAX_DEPTH:
                raise CardHeaderError(f"{self.what} is nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.nesting -= 1


def load_yaml(text: str, what: str = "the YAML", first_line: int = 0) -> Any:
    """``text`` read as YAML by a safe loader that refuses aliases, nesting deeper than :data:`MAX_DEPTH` and text
    longer than :data:`MAX_HEADER_CHARS` (:class:`CardHeaderError` naming ``what``; lines counted from
    ``first_line`` + 1)."""
    if len(text) > MAX_HEADER_CHARS:
        raise CardHeaderError(f"{what} is {len(text)} characters; the viewer reads at most {MAX_HEADER_CHARS}")
    loader = _NoAliasLoader(text)
    loader.what, loader.first_line = what, first_line
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise CardHeaderError(f"{what} is not YAML: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


def read_card_header(card: str) -> dict[str, Any]:
    """The YAML header of ``card`` (between its first line ``---`` and the next line ``---``) as a dict (empty: none);
    :class:`CardHeaderError` for one that uses aliases, is nested deeper than :data:`MAX_DEPTH`, is larger than
    :data:`MAX_HEADER_CHARS`, is not YAML or is not a mapping."""
    match = HEADER.match(card)
    if match is None:
        return {}
    header = load_yaml(match[1], "the card's YAML header", first_line=1)
    if header is None:
        return {}
    if not isinstance(header, dict):
        raise CardHeaderError(f"the card's YAML header is a {type(header).__name__}, not a mapping of keys")
    return header


def card_provenance(card: str | None) -> dict[str, Any]:
    """The card's YAML header keys (``pretty_name``, ``license``, ``tags``), its hf_rollouts version and its "Agent and
    sampling" table (model, sampling, seed, options). A header the viewer does not read is ``error`` (its reason),
    the body's provenance still read."""
    if not card:
        return {}
    out: dict[str, Any] = {}
    try:
        header = read_card_header(card)
        out["header"] = {k: header[k] for k in ("pretty_name", "license", "tags") if k in header}
    except CardHeaderError as exc:
        out["error"] = str(exc)
    generated = re.search(r"generated with hf_rollouts ([^\s.]+(?:\.[^\s.]+)*)\.", card)
    if generated:
        out["version"] = generated[1]
    section = card.split("## Agent and sampling", 1)[1].split("\n## ", 1)[0] if "## Agent and sampling" in card else ""
    rows = re.findall(r"^\| ([^|]+?) \| `(.*)` \|$", section, flags=re.M)
    out["settings"] = [[k.strip(), v] for k, v in rows]
    return out


__all__ = ["MAX_DEPTH", "MAX_HEADER_CHARS", "CardHeaderError", "card_provenance", "load_yaml", "read_card_header"]
