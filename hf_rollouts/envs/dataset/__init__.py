"""Your dataset as an environment: :class:`DatasetEnv` (a row's prompt, the reply, a verifier's verdict) and
:func:`to_task_rows` (a dataset's columns -> task rows, for ``Dataset.map``)."""

from .env import DEFAULT_FEEDBACK, DatasetConfig, DatasetEnv, DatasetEpisode, PromptParts, prompt_parts
from .humaneval import humaneval_problems, humaneval_tasks
from .rows import CODE_ENV_CONFIG, TaskRows, answer_column_option, load_source, to_task_rows

__all__ = [
    "CODE_ENV_CONFIG",
    "DEFAULT_FEEDBACK",
    "DatasetConfig",
    "DatasetEnv",
    "DatasetEpisode",
    "PromptParts",
    "TaskRows",
    "answer_column_option",
    "humaneval_problems",
    "humaneval_tasks",
    "load_source",
    "prompt_parts",
    "to_task_rows",
]
