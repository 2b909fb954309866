"""The rollout machinery: the episode loop, token recording, scheduling many episodes, padding.

* :mod:`.recorder` — :class:`EpisodeRecorder`, the only place that appends tokens to an episode;
* :mod:`.episode` — :func:`run_episode`, the loop of one episode;
* :mod:`.jobs` — :class:`EpisodeJob` / :func:`episode_jobs`: which episodes to play, with their seeds;
* :mod:`.scheduler` — :func:`run_episodes`, many episodes at once, each advancing as its answer arrives;
* :mod:`.live` — one running episode as the scheduler sees it: generator, clock, time limits;
* :mod:`.threads` — the scheduler's reusable worker threads and its garbage-collector setting;
* :mod:`.aio` — the engine's event loop, where ``async def`` env hooks run;
* :mod:`.group` — :func:`apply_group_rewards`, an env's group rewards over a task's finished rollouts;
* :mod:`.padding` — :func:`pad_task`, per-task padding into the rollout columns.

Nothing here imports an environment module: environments are used through the hooks
(:class:`EpisodeEnv`), so ``hf_rollouts.envs.base`` can delegate here without a cycle.
"""

from .aio import ENGINE_LOOP, resolve
from .episode import EpisodeEnv, run_episode
from .group import apply_group_rewards, uses_group_hook
from .jobs import EpisodeJob, episode_jobs
from .padding import pad_groups, pad_task
from .recorder import REWARD_PLACEMENTS, EpisodeRecorder
from .scheduler import DEFAULT_ENV_WORKERS, run_episodes

__all__ = [
    "DEFAULT_ENV_WORKERS",
    "ENGINE_LOOP",
    "REWARD_PLACEMENTS",
    "EpisodeEnv",
    "EpisodeJob",
    "EpisodeRecorder",
    "apply_group_rewards",
    "uses_group_hook",
    "episode_jobs",
    "pad_groups",
    "pad_task",
    "resolve",
    "run_episode",
    "run_episodes",
]
