"""What the viewer reads from a dataset card (``README.md``): its YAML header, read with aliases refused
(:func:`~hf_rollouts.provenance.card_yaml.read_card_header`, re-exported here with :class:`CardHeaderError`; a header
refused is shown on the page), and the provenance ``hf_rollouts`` writes in its body.
"""

from __future__ import annotations

import re
from typing import Any

from ..provenance.card_yaml import MAX_DEPTH, MAX_HEADER_CHARS, CardHeaderError, load_yaml, read_card_header


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
