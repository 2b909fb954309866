"""The rollout machinery: the episode loop, token recording, scheduling many episodes, padding.

* :mod:`.recorder` — :class:`EpisodeRecorder`, the only place that appends tokens to an episode;
* :mod:`.episode` — :func:`run_episode`, the loop of one episode;
* :mod:`.scheduler` — :func:`run_episodes`, many episodes at once sharing the agent's calls;
* :mod:`.padding` — :func:`pad_task`, per-task padding into the rollout columns.

Nothing here imports an environment module: environments are used through the hooks
(:class:`EpisodeEnv`), so ``hf_rollouts.envs.base`` can delegate here without a cycle.
"""

from .episode import EpisodeEnv, run_episode
from .padding import pad_groups, pad_task
from .recorder import REWARD_PLACEMENTS, EpisodeRecorder
from .scheduler import EpisodeJob, episode_jobs, run_episodes

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
