"""Look at rollouts: a local web viewer for rollout datasets (``hf-rollouts view PATH``, :func:`view`).

The page works offline (its script and styles ship in this package), reads rows on demand from the memory-mapped
Arrow files, and renders model text as text. See docs/guides/viewer.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .server import Viewer, ViewerServer, render_html
from .source import open_rollouts


def view(
    dataset: Any,
    compare: Any = None,
    *,
    tokenizer: Any = None,
    host: str = "127.0.0.1",
    port: int = 0,
    html: str | Path | None = None,
) -> str:
    """Open the viewer on a rollout dataset and return its address (a notebook can show it, e.g. in an IFrame).

    Args:
        dataset: a rollout ``Dataset``, or a place one is kept: a ``save_to_disk`` folder (``hf-rollouts generate
            --output``), a parquet file or folder, a shard cache folder, a Hub id.
        compare: a second rollout dataset of the same tasks (e.g. after training), shown side by side.
        tokenizer: to show each token's text (default: the ``tokenizer/`` folder saved beside the data; without
            one, tokens show by id and the conversation as its text).
        host: the address to bind; the default serves this machine only.
        port: 0 picks a free port.
        html: write one self-contained page there instead of serving (small datasets); returns its ``file://`` URL.

    The server runs in a background thread of this process until the process ends; :func:`serve` returns the
    :class:`~hf_rollouts.viewer.server.ViewerServer` to stop it yourself.
    """
    if html is not None:
        return write_html(dataset, html, compare=compare, tokenizer=tokenizer)
    return serve(dataset, compare=compare, tokenizer=tokenizer, host=host, port=port).url


def serve(
    dataset: Any, compare: Any = None, *, tokenizer: Any = None, host: str = "127.0.0.1", port: int = 0
) -> ViewerServer:
    """Start the viewer in a background thread; the returned server has its ``url`` and a ``close()``."""
    main = open_rollouts(dataset, tokenizer)
    other = (
        open_rollouts(compare, tokenizer if tokenizer is not None else main.tokenizer) if compare is not None else None
    )
    return ViewerServer(Viewer(main, other), host, port).start()


def write_html(dataset: Any, path: str | Path, *, compare: Any = None, tokenizer: Any = None) -> str:
    """Write the viewer as one self-contained HTML file at ``path`` (at most
    :data:`~hf_rollouts.viewer.server.MAX_HTML_TASKS` tasks) and return its ``file://`` URL."""
    main = open_rollouts(dataset, tokenizer)
    other = (
        open_rollouts(compare, tokenizer if tokenizer is not None else main.tokenizer) if compare is not None else None
    )
    target = Path(path)
    target.write_text(render_html(Viewer(main, other, background=False)), encoding="utf-8")
    return target.resolve().as_uri()


__all__ = ["serve", "view", "write_html"]
