"""The rollout machinery: the episode loop, token recording, scheduling many episodes, padding.

* :mod:`.recorder` — :class:`EpisodeRecorder`, the only place that appends tokens to an episode;
* :mod:`.episode` — :func:`run_episode`, the loop of one episode;
* :mod:`.jobs` — :class:`EpisodeJob` / :func:`episode_jobs`: which episodes to play, with their seeds;
* :mod:`.scheduler` — :func:`run_episodes`, many episodes at once, each advancing as its answer arrives;
* :mod:`.threads` — the scheduler's reusable driver threads and its garbage-collector setting;
* :mod:`.padding` — :func:`pad_task`, per-task padding into the rollout columns.

Nothing here imports an environment module: environments are used through the hooks
(:class:`EpisodeEnv`), so ``hf_rollouts.envs.base`` can delegate here without a cycle.
"""

from .episode import EpisodeEnv, run_episode
from .jobs import EpisodeJob, episode_jobs
from .padding import pad_groups, pad_task
from .recorder import REWARD_PLACEMENTS, EpisodeRecorder
from .scheduler import run_episodes

__all__ = [
    "REWARD_PLACEMENTS",
    "EpisodeEnv",
    "EpisodeJob",
    "EpisodeRecorder",
    "episode_jobs",
    "pad_groups",
    "pad_task",
    "run_episode",
    "run_episodes",
]
