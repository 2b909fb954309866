"""``hf-rollouts view PATH``: serve the viewer on a rollout dataset (or write it as one HTML file)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser


@dataclass
class ViewArgs:
    compare: str | None = field(
        default=None,
        metadata={"help": "A second rollout dataset of the same tasks (e.g. after training) to compare with PATH."},
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer id/path to show each token's text (default: PATH/tokenizer, saved by generate)."},
    )
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset or a DatasetDict folder."})
    host: str = field(
        default="127.0.0.1",
        metadata={
            "help": "Address to bind. The default serves this machine only (so does ::1, over IPv6); 0.0.0.0 serves "
            "the network."
        },
    )
    port: int = field(default=0, metadata={"help": "Port to serve on (0: a free one)."})
    html: str | None = field(
        default=None,
        metadata={"help": "Write one self-contained HTML page to this file instead of serving (at most 500 tasks)."},
    )


def view_parser() -> HfArgumentParser:
    parser = HfArgumentParser([ViewArgs], prog="hf-rollouts view")
    parser.add_argument(
        "path",
        help="Rollout dataset: a folder written by `hf-rollouts generate --output` (or save_to_disk), a parquet file "
        "or folder, a shard cache folder of generate_rollouts, or a Hub dataset id.",
    )
    return parser


def run_view(argv: list[str]) -> int:
    """Open the dataset(s), then write the page (``--html``) or print the address and serve until interrupted. A
    dataset that cannot be opened is one ``error:`` line and exit code 2, as in the rest of the CLI."""
    args, ns = view_parser().parse_args_into_dataclasses(argv)
    from .server import Viewer, ViewerServer, is_loopback, render_html
    from .source import open_rollouts

    try:
        main = open_rollouts(ns.path, args.tokenizer, args.split)
        other = open_rollouts(args.compare, args.tokenizer or main.tokenizer, args.split) if args.compare else None
    except (FileNotFoundError, KeyError, ValueError) as exc:  # a path, split or dataset that cannot be shown
        print(f"error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)  # the CLI's one-line errors, exit 2
        return 2
    for note in main.notes + (other.notes if other else []):
        print(note)
    if args.html:
        from pathlib import Path

        Path(args.html).write_text(render_html(Viewer(main, other, background=False)), encoding="utf-8")
        print(f"wrote {args.html}: open it in a browser (it needs no server and no network)")
        return 0
    server = ViewerServer(Viewer(main, other), args.host, args.port)
    print(f"hf-rollouts view: serving {main.label} at {server.url}  (Ctrl-C stops it)", flush=True)
    if not is_loopback(args.host):
        print(
            f"warning: bound to {args.host}: anyone who can reach this machine can read the rollouts", file=sys.stderr
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


__all__ = ["ViewArgs", "run_view", "view_parser"]
