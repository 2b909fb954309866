"""A dataset card's YAML header read with aliases refused: the one reader of cards' YAML for every part that reads
one (the viewer, ``verify``'s provenance, ``rescore``).

A card is data from wherever the dataset came from. YAML aliases (``*name``) let a few hundred bytes stand for
millions of nodes (an "alias bomb": each level repeats the one before); PyYAML loads such a header quickly as a graph
of shared objects, and whatever walks it (a JSON answer, a copy, ``huggingface_hub``'s ``CardData``) expands it, for
seconds and gigabytes. Cards that ``hf_rollouts`` and the Hub write use no aliases, so :func:`read_card_header`
refuses them (and headers nested deeper than :data:`MAX_DEPTH` or larger than :data:`MAX_HEADER_CHARS`) with
:class:`CardHeaderError`. :func:`read_card_file` reads a card file (at most :data:`MAX_CARD_BYTES`) and its header.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MAX_HEADER_CHARS = 1_000_000
"""The largest YAML header read (a card's header is a few hundred bytes to a few KB)."""
MAX_DEPTH = 64
"""The deepest nesting of a YAML header read (PyYAML composes recursively)."""
MAX_CARD_BYTES = 8_000_000
"""The largest card file :func:`read_card_file` reads."""


class CardHeaderError(ValueError):
    """A card's YAML header that is not read: it uses aliases, is too deep or too large, or is not YAML."""


HEADER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*$", re.S | re.M)
"""A card's YAML header: between a first line ``---`` and the next line ``---`` (as huggingface_hub reads it)."""


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (and with them merge keys, ``<<: *name``) and deep nesting."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise CardHeaderError(
                f"{self.what} uses an alias (*{event.anchor}, line {event.start_mark.line + 1 + self.first_line}); "
                "hf_rollouts reads no YAML aliases (a few of them can stand for millions of nodes); write the values "
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
        raise CardHeaderError(f"{what} is {len(text)} characters; hf_rollouts reads at most {MAX_HEADER_CHARS}")
    loader = _NoAliasLoader(text)
    loader.what, loader.first_line = what, first_line
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise CardHeaderError(f"{what} is not YAML: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


def read_card_header(card: str, what: str = "the card's YAML header") -> dict[str, Any]:
    """The YAML header of ``card`` (between its first line ``---`` and the next line ``---``) as a dict (empty: none);
    :class:`CardHeaderError` (naming ``what``) for one that uses aliases, is nested deeper than :data:`MAX_DEPTH`, is
    larger than :data:`MAX_HEADER_CHARS`, is not YAML or is not a mapping."""
    match = HEADER.match(card)
    if match is None:
        return {}
    header = load_yaml(match[1], what, first_line=1)
    if header is None:
        return {}
    if not isinstance(header, dict):
        raise CardHeaderError(f"{what} is a {type(header).__name__}, not a mapping of keys")
    return header


def read_card_file(path: str | Path) -> dict[str, Any]:
    """The YAML header of the card file ``path`` (:func:`read_card_header`; errors name the file), refused as
    :class:`CardHeaderError` past :data:`MAX_CARD_BYTES`."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_CARD_BYTES:
        raise CardHeaderError(f"{path} is {size} bytes; hf_rollouts reads cards of at most {MAX_CARD_BYTES}")
    return read_card_header(path.read_text(encoding="utf-8"), f"the YAML header of {path}")


__all__ = [
    "MAX_CARD_BYTES",
    "MAX_DEPTH",
    "MAX_HEADER_CHARS",
    "CardHeaderError",
    "load_yaml",
    "read_card_file",
    "read_card_header",
]
