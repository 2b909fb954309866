"""Any single-player `TextArena <https://github.com/LeonGuertler/TextArena>`_ game as an environment.

``env_config``:

* ``env_id`` (required): a TextArena game id, e.g. ``"Mastermind-v0"``,
  ``"GuessTheNumber-v0"``, ``"TowerOfHanoi-v0"``, ``"FrozenLake-v0"``.
* any other key that is not one of :data:`RESERVED_KEYS` is passed to
  ``textarena.make(env_id, **kwargs)``; ``make_kwargs`` (a dict) passes keys
  whose names collide with ours (``{"make_kwargs": {"max_turns": 8}}`` sets the
  *game's* turn limit, ``max_turns`` sets the episode's).
* ``max_turns``: agent turns before the episode is truncated. Default: enough
  for the game to end by itself, ``(error_allowance + 1) * game max_turns``
  (TextArena lets a player retry an invalid move without spending a turn), or
  100 when the game has no turn limit.
* ``num_train_tasks`` (1000) / ``num_eval_tasks`` (100): split sizes when
  ``num_tasks`` is not given.
* ``disjoint_games`` (False): seeds are always disjoint between train and eval,
  but a small game (20 numbers to guess) repeats its games across seeds. With
  ``True`` each split keeps only distinct games and train drops every game of
  the eval pool (the first ``num_eval_tasks`` distinct eval games); the game is
  identified by TextArena's ``state.game_state``.
* ``empty_observation``: message sent when a move produced no new game message.
* the common keys of :class:`~hf_rollouts.envs.base.MultistepEnv`
  (``max_episode_tokens``, ``reward_placement``, ``system_prompt``, ``seed``).

``task_data``: ``{"seed": int}`` — the seed of ``env.reset``; the same seed
gives the same game.

Mapping of TextArena's contract (``reset`` / ``get_observation`` / ``step`` /
``close``):

* one TextArena env per episode, made with ``textarena.make`` (so the
  registry's *action* wrappers, e.g. bracket formatting, apply) and kept in the
  episode state, never on ``self``;
* the agent's message at each turn is the game's *new* observations since its
  last move, read raw from the innermost env (the LLM observation wrappers,
  which replay the whole history every turn, are bypassed: the chat already
  holds the history). The echo of the player's own move is left out;
* ``done`` is TextArena's ``done``; the step reward is 0 until the game ends,
  then the player's reward from ``close()`` (TextArena 0.7 returns
  ``(rewards, game_info)``, older versions the rewards alone). The game's
  ``reason`` is in the last turn's ``info``.

Randomness: TextArena games draw from the *global* ``random`` (and some from
``numpy.random``); every ``make`` / ``reset`` / ``step`` runs with the global
generators swapped for the episode's own state (:mod:`.global_random`), so
concurrent episodes stay reproducible.

Games that cannot run offline fail at construction with
:class:`TextArenaGameUnavailable`: games that call a hosted LLM (TwentyQuestions,
GuessWho, Debate, ...), games whose NLTK data is not installed (Wordle, Hangman,
... — TextArena would try to download it when the module is imported; both read
from the game's source, :mod:`.offline`),
multi-player games and games whose reset fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ...types import scalar_info
from ..adapter import AdapterEnv, AdapterEpisode
from ..config import EnvConfig, option
from ..task_data import task_int
from .global_random import swapped_global_random
from .offline import static_problem

DEFAULT_EMPTY_OBSERVATION = "(No new message from the game. Make your next move.)"


@dataclass(frozen=True, kw_only=True)
class TextArenaConfig(EnvConfig):
    """TextArena's keys; any key not declared here goes to ``textarena.make`` (so no unknown-key warning)."""

    env_id: str = option(help="A TextArena game id, e.g. 'Mastermind-v0'.")
    make_kwargs: dict | None = option(None, "Keyword arguments of textarena.make whose names collide with ours.")
    num_train_tasks: int = option(1000, "Train split size when num_tasks is not given.", ge=1)
    num_eval_tasks: int = option(100, "Eval split size when num_tasks is not given.", ge=1)
    disjoint_games: bool = option(False, "Keep only distinct games per split, none of eval's in train.")
    empty_observation: str = option(DEFAULT_EMPTY_OBSERVATION, "Message sent when a move produced no new message.")

    extra_keys_allowed = True


RESERVED_KEYS = frozenset(TextArenaConfig.keys())
"""``env_config`` keys read by :class:`TextArenaEnv` itself; all others go to ``textarena.make``."""


class TextArenaGameUnavailable(RuntimeError):
    """A TextArena game that cannot be played here (hosted model, missing data, not single-player, ...)."""


def import_textarena() -> Any:
    """Import the optional ``textarena`` package, or raise ``ImportError`` saying how to install it."""
    return TextArenaEnv.import_package()


def _innermost(env: Any, ta: Any) -> Any:
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    return repr(value)


@dataclass
class TextArenaEpisode(AdapterEpisode):
    """Per-episode state: the game, its RNG state (and the next message for the agent)."""

    seed: int
    game: Any = None  # the env textarena.make returned (actions go through its wrappers)
    core: Any = None  # the innermost env (observations are read raw from it)
    player_id: int = 0
    random_state: Any = None
    numpy_random_state: Any = None
    rewards: dict | None = None
    game_info: dict | None = None


class TextArenaEnv(AdapterEnv):
    name = "textarena"
    package, distribution, extra = "textarena", "textarena", "textarena"
    default_max_turns = 100
    default_max_reward = 1.0  # TextArena's reward of a won game
    config_class = TextArenaConfig

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        self.ta = import_textarena()
        c = self.config
        if not c.env_id:
            raise ValueError('TextArenaEnv needs env_config["env_id"], a TextArena game id such as "Mastermind-v0".')
        env_id = self.env_id = c.env_id
        self.make_kwargs = {k: v for k, v in self.env_config.items() if k not in RESERVED_KEYS}
        self.make_kwargs.update(c.make_kwargs or {})
        self.num_train_tasks, self.num_eval_tasks = c.num_train_tasks, c.num_eval_tasks
        self.disjoint_games, self.empty_observation = c.disjoint_games, c.empty_observation

        from textarena.envs.registration import ENV_REGISTRY

        spec = ENV_REGISTRY.get(env_id)
        if spec is None:
            close = sorted(k for k in ENV_REGISTRY if k.split("-")[0].lower() == env_id.split("-")[0].lower())
            hint = f" Ids of that game: {close}." if close else ""
            raise ValueError(f"{env_id!r} is not a registered TextArena game.{hint}")
        problem = static_problem(env_id, spec.entry_point, self.ta)
        if problem:
            raise TextArenaGameUnavailable(f"TextArena game {env_id!r} cannot run here: {problem}.")
        game_turns, allowance = self._probe()
        if c.max_turns is None:
            self.max_turns = (allowance + 1) * game_turns if game_turns else self.default_max_turns

    # -- construction checks ----------------------------------------------------
    def _probe(self) -> tuple[int | None, int]:
        """Make and reset one game; return its turn limit and invalid-move allowance."""
        probe = TextArenaEpisode(seed=0)
        try:
            self._new_game(probe)
        except TextArenaGameUnavailable:
            raise
        except Exception as exc:
            hint = " (it is not a single-player game)" if "player" in str(exc).lower() else ""
            raise TextArenaGameUnavailable(
                f"TextArena game {self.env_id!r} cannot run here{hint}: making and resetting it failed with "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        state = probe.core.state
        turns = getattr(state, "max_turns", None) or getattr(probe.core, "max_turns", None)
        allowance = getattr(state, "error_allowance", 1) or 0
        return (int(turns) if turns else None), int(allowance)

    # -- one game ---------------------------------------------------------------
    def _new_game(self, episode: TextArenaEpisode) -> None:
        """Make, reset and read the first observation of ``episode``'s game (deterministic in its seed)."""
        ta = self.ta
        with swapped_global_random(episode, seed=episode.seed):
            game = ta.make(self.env_id, **self.make_kwargs)
            core = _innermost(game, ta)
            game.reset(num_players=1, seed=episode.seed)
            if not isinstance(getattr(core, "state", None), ta.SinglePlayerState):
                raise TextArenaGameUnavailable(
                    f"TextArena game {self.env_id!r} is not a single-player game "
                    f"(its state is {type(getattr(core, 'state', None)).__name__}); TextArenaEnv plays single-player "
                    "games only"
                )
            player_id, observations = core.get_observation()
        episode.game, episode.core, episode.player_id = game, core, int(player_id)
        episode.message = self._render(observations, episode.player_id)

    def _render(self, observations: Any, player_id: int) -> str:
        """The game's new messages as one text, without the echo of the player's own move."""
        if isinstance(observations, str):
            return observations.strip() or self.empty_observation
        action_type = getattr(getattr(self.ta, "ObservationType", None), "PLAYER_ACTION", None)
        parts = []
        for item in observations or []:
            from_id, message = item[0], item[1]
            obs_type = item[2] if len(item) > 2 else None
            # single-player: every PLAYER_ACTION is the echo of the agent's own move (some games send it
            # from GAME_ID), already in the chat as the assistant message
            if (obs_type is not None and obs_type == action_type) or (obs_type is None and from_id == player_id):
                continue
            text = str(message).strip("\n")
            if text.strip():
                parts.append(text)
        return "\n".join(parts) or self.empty_observation

    @staticmethod
    def _close(game: Any) -> tuple[dict | None, dict | None]:
        result = game.close()
        if isinstance(result, tuple) and len(result) == 2 and (result[0] is None or isinstance(result[0], dict)):
            return result[0], result[1] if isinstance(result[1], dict) else None
        if isinstance(result, dict) or result is None:
            return result, None
        raise TypeError(
            f"TextArena close() returned {type(result).__name__}; expected rewards or (rewards, game_info)."
        )

    # -- hooks ------------------------------------------------------------------
    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """``seed``: an int (the game's seed)."""
        task_int(task_data, "seed", "TextArenaEnv")

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> TextArenaEpisode:
        episode = TextArenaEpisode(seed=task_int(task_data, "seed", "TextArenaEnv"))
        self._new_game(episode)
        return episode

    def _step_episode(
        self, session_id: str, state: TextArenaEpisode, action: str
    ) -> tuple[TextArenaEpisode, float, bool, dict[str, Any]]:
        self.check_live(state, f"TextArena game {self.env_id!r} (seed {state.seed})")
        with swapped_global_random(state):
            done, step_info = state.game.step(action)
            if done:
                rewards, game_info = self._close(state.game)
            else:
                _, observations = state.core.get_observation()
        info = scalar_info(step_info)
        if not done:
            state.message = self._render(observations, state.player_id)
            return state, 0.0, False, info
        state.done, state.rewards, state.game_info = True, rewards, game_info
        player_info = (game_info or {}).get(state.player_id, {}) if isinstance(game_info, dict) else {}
        reward = 0.0
        if rewards:
            reward = float(rewards.get(state.player_id, next(iter(rewards.values()))))
        info.update(
            game_reward=reward,
            reason=str(player_info.get("reason")) if player_info.get("reason") is not None else None,
            invalid_move=bool(player_info.get("invalid_move", False)),
        )
        return state, reward, True, info

    # -- tasks ------------------------------------------------------------------
    def _seeds(self, split: str) -> Iterator[int]:
        """Endless, distinct, reproducible seeds: even for train, odd for eval (so always disjoint)."""
        return self.split_seeds(split, self.env_id)

    def _game_key(self, seed: int) -> str:
        episode = TextArenaEpisode(seed=seed)
        self._new_game(episode)
        return json.dumps(getattr(episode.core.state, "game_state", None), sort_keys=True, default=_jsonable)

    def _distinct(self, split: str, n: int, exclude: set[str]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        keys = set(exclude)
        budget = 20 * n + 200
        for tries, seed in enumerate(self._seeds(split)):
            if len(out) >= n:
                break
            if tries >= budget:
                raise ValueError(
                    f"TextArena game {self.env_id!r}: found only {len(out)} distinct {split} games (wanted {n}) in "
                    f"{budget} seeds "
                    "with disjoint_games=True; the game has few distinct games — lower num_tasks / num_eval_tasks."
                )
            key = self._game_key(seed)
            if key not in keys:
                keys.add(key)
                out.append((seed, key))
        return out

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        n = self.split_size(split, num_tasks)
        if not self.disjoint_games:
            seeds = self._seeds(split)
            return [{"seed": next(seeds)} for _ in range(n)]
        if split == "eval":
            if n > self.num_eval_tasks:
                raise ValueError(
                    f"disjoint_games=True keeps a fixed eval pool of num_eval_tasks={self.num_eval_tasks}; asked for "
                    f"{n}."
                )
            return [{"seed": s} for s, _ in self._distinct("eval", self.num_eval_tasks, set())[:n]]
        eval_keys = {k for _, k in self._distinct("eval", self.num_eval_tasks, set())}
        return [{"seed": s} for s, _ in self._distinct("train", n, eval_keys)]
