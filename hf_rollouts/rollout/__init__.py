"""The rollout machinery: the episode loop, token recording, playing many episodes at once, group rewards, padding.

* :mod:`.recorder` — :class:`EpisodeRecorder`, the only place that appends tokens to an episode;
* :mod:`.episode` — :func:`episode_steps` / :func:`run_episode`, the loop of one episode;
* :mod:`.tool_loop` — one agent turn with its tool calls answered;
* :mod:`.jobs` — :class:`EpisodeJob`, :class:`GroupJob`: which episodes to play, with their seeds;
* :mod:`.engine` — :func:`play_groups`, many episodes at once on the engine loop, each advancing as its answer
  arrives, within time limits; group rewards as each group finishes;
* :mod:`.workers` — the threads that run sync env hooks, and the policy that decides how many an env gets;
* :mod:`.group` — :class:`EpisodeGroup` and the group reward step;
* :mod:`.padding` — :func:`pad_task`, per-task padding into the rollout columns.

Nothing here imports an environment module: environments are used through the hooks
(:class:`EpisodeEnv`), so ``hf_rollouts.envs.base`` can delegate here without a cycle.
"""

from ..aio import ENGINE_LOOP, resolve
from .engine import play_groups, run_episodes
from .episode import EpisodeEnv, run_episode
from .group import EpisodeGroup, apply_group_rewards
from .jobs import EpisodeJob, GroupJob, episode_jobs, task_groups
from .padding import pad_groups, pad_task
from .plays import Phase
from .recorder import REWARD_PLACEMENTS, EpisodeRecorder
from .workers import DEFAULT_ENV_WORKERS

__all__ = [
    "DEFAULT_ENV_WORKERS",
    "ENGINE_LOOP",
    "REWARD_PLACEMENTS",
    "EpisodeEnv",
    "EpisodeGroup",
    "EpisodeJob",
    "EpisodeRecorder",
    "GroupJob",
    "Phase",
    "apply_group_rewards",
    "episode_jobs",
    "pad_groups",
    "pad_task",
    "play_groups",
    "resolve",
    "run_episode",
    "run_episodes",
    "task_groups",
]
