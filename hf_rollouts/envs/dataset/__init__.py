"""Your dataset as an environment: :class:`DatasetEnv` (a row's prompt, the reply, a verifier's verdict) and
:func:`to_task_rows` (a dataset's columns -> task rows, for ``Dataset.map``)."""

from .env import DEFAULT_FEEDBACK, DatasetConfig, DatasetEnv, DatasetEpisode, prompt_parts
from .rows import TaskRows, load_source, to_task_rows

__all__ = [
    "DEFAULT_FEEDBACK",
    "DatasetConfig",
    "DatasetEnv",
    "DatasetEpisode",
    "TaskRows",
    "load_source",
    "prompt_parts",
    "to_task_rows",
]
