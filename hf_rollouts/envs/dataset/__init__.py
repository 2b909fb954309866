"""Your dataset as an environment: :class:`DatasetEnv` (a row's prompt, the reply, a verifier's verdict) and
:func:`to_task_rows` (a dataset's columns -> task rows, for ``Dataset.map``)."""

from .env import DEFAULT_FEEDBACK, DatasetConfig, DatasetEnv, DatasetEpisode, prompt_parts

__all__ = ["DEFAULT_FEEDBACK", "DatasetConfig", "DatasetEnv", "DatasetEpisode", "prompt_parts"]
