"""Publishing a rollout dataset: save (Arrow + parquet), push to the Hub, the dataset card,
summary statistics and a readable view of one trajectory."""

from .card import render_card
from .render import format_trajectory
from .save import LOGPROB_DTYPES, parquet_files, push_rollouts, save_rollouts, with_logprob_dtype, write_parquet
from .stats import RolloutStats, compute_stats

__all__ = [
    "LOGPROB_DTYPES",
    "RolloutStats",
    "compute_stats",
    "format_trajectory",
    "parquet_files",
    "push_rollouts",
    "render_card",
    "save_rollouts",
    "with_logprob_dtype",
    "write_parquet",
]
