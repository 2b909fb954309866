"""TextArenaEnv: single-player TextArena games played offline, seeded, with the game's rewards."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import sys

import pytest

pytest.importorskip("textarena")

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.envs.mastermind import score_guess  # noqa: E402
from hf_rollouts.envs.registry import class_path  # noqa: E402
from hf_rollouts.envs.textarena import TextArenaEnv, TextArenaGameUnavailable  # noqa: E402

OFFLINE_GAMES = ["Mastermind-v0", "GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0"]
HANOI_SOLUTION = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


def _env(tokenizer, env_id, **config):
    return TextArenaEnv(tokenizer, {"env_id": env_id, **config})


# -- scripted players that only read the conversation ---------------------------
def guess_the_number_player(messages):
    """Binary search on the game's 'higher'/'lower' hints."""
    lo, hi, last = 1, 20, None
    for m in messages:
        if m["role"] == "assistant":
            last = int(re.search(r"\d+", m["content"]).group())
        elif last is not None and "higher" in m["content"]:
            lo = last + 1
        elif last is not None and "lower" in m["content"]:
            hi = last - 1
    return f"My guess: [{(lo + hi) // 2}]"


def mastermind_player(messages):
    """Guess the first code consistent with all feedback so far (4 digits, 1-6, no duplicates)."""
    candidates = list(itertools.permutations(range(1, 7), 4))
    for m in messages:
        fb = re.search(r"Submitted \[([\d ]+)\]\. Feedback: (\d+) black peg\(s\), (\d+) white peg\(s\)", m["content"])
        if m["role"] == "user" and fb:
            guess = [int(x) for x in fb.group(1).split()]
            black, white = int(fb.group(2)), int(fb.group(3))
            candidates = [c for c in candidates if score_guess(list(c), guess) == (black, white)]
    return "[" + " ".join(map(str, candidates[0])) + "]"


# -- construction and prompts -----------------------------------------------------
@pytest.mark.parametrize("env_id", OFFLINE_GAMES)
def test_offline_games_construct_and_start(tokenizer, env_id):
    env = _env(tokenizer, env_id)
    assert env.max_turns >= 2  # default: long enough for the game to end by itself
    state = env._initialize_episode("s", {"seed": 5})
    prompt = env._format_prompt(state, 0)
    assert isinstance(prompt, str) and len(prompt) > 50
    assert state.game is not None and not hasattr(env, "game")  # the game lives in the episode state
    out = env.run_trial([{"seed": 1}], ScriptedAgent(["[nonsense]"]), num_rollouts=1)
    assert out["statuses"][0] in ("done", "truncated")


def test_game_kwargs_and_turn_limit(tokenizer):
    env = _env(tokenizer, "GuessTheNumber-v0", max_number=10, make_kwargs={"max_turns": 3}, max_turns=5)
    assert env.make_kwargs == {"max_number": 10, "max_turns": 3} and env.max_turns == 5
    state = env._initialize_episode("s", {"seed": 0})
    assert "between 1 and 10 within 3 turns" in state.message
    assert _env(tokenizer, "GuessTheNumber-v0", make_kwargs={"max_turns": 3}).max_turns == 6  # (allowance + 1) * 3


# -- episodes with rewards from the game -------------------------------------------
def test_tower_of_hanoi_scripted_win(tokenizer):
    env = _env(tokenizer, "TowerOfHanoi-v0")
    out = env.run_trial([{"seed": 0}], ScriptedAgent(HANOI_SOLUTION), num_rollouts=2)
    assert out["statuses"] == ["done", "done"] and out["final_rewards"] == [1.0, 1.0]
    assert out["num_turns"] == [7, 7]
    rewards, mask = out["padded_per_token_rewards"][0], out["padded_agent_token_mask"][0]
    assert sum(rewards) == 1.0 and all(m == 1 for r, m in zip(rewards, mask) if r)
    conv = out["conversations"][0]
    assert conv[0]["role"] == "user" and "Tower of Hanoi" in conv[0]["content"]
    assert (
        "You moved disk 1 from A to C" in conv[2]["content"] and "[A C]" not in conv[2]["content"]
    )  # no echo of the move


def test_guess_the_number_binary_search_wins(tokenizer):
    env = _env(tokenizer, "GuessTheNumber-v0")
    out = env.run_trial([{"seed": s} for s in range(6)], ScriptedAgent(guess_the_number_player), num_rollouts=1)
    assert out["statuses"] == ["done"] * 6 and out["final_rewards"] == [1.0] * 6


def test_mastermind_solver_wins_and_invalid_moves_end_the_game(tokenizer):
    env = _env(tokenizer, "Mastermind-v0")
    out = env.run_trial([{"seed": 11}, {"seed": 12}], ScriptedAgent(mastermind_player), num_rollouts=1)
    assert out["statuses"] == ["done", "done"] and out["final_rewards"] == [1.0, 1.0]
    # two invalid answers in a row: TextArena warns once, then ends the game with its own reward
    ep = env._run_complete_episode("bad", ScriptedAgent(["no idea"]), {"seed": 11})
    assert ep["status"] == "done" and ep["num_turns"] == 2 and ep["final_reward"] == 0.0
    assert "invalid move" in ep["messages"][2]["content"].lower()
    last = ep["turns"][-1].info
    assert last["invalid_move"] is True and "Invalid Move" in last["reason"]


def test_truncation_gives_no_game_reward(tokenizer):
    env = _env(tokenizer, "TowerOfHanoi-v0", max_turns=3)
    ep = env._run_complete_episode("s", ScriptedAgent(HANOI_SOLUTION), {"seed": 0})
    assert ep["status"] == "truncated" and ep["num_turns"] == 3 and ep["final_reward"] == 0.0


# -- seeding -----------------------------------------------------------------------
def test_same_seed_same_game_and_global_random_untouched(tokenizer):
    a, b = _env(tokenizer, "Mastermind-v0"), _env(tokenizer, "Mastermind-v0")
    random.seed(1234)
    expected = random.Random(1234).random()
    sa, sb = a._initialize_episode("x", {"seed": 7}), b._initialize_episode("y", {"seed": 7})
    assert random.random() == expected  # the caller's global random state is restored
    assert sa.message == sb.message
    assert sa.core.state.game_state["secret_code"] == sb.core.state.game_state["secret_code"]
    codes = {tuple(a._initialize_episode("z", {"seed": s}).core.state.game_state["secret_code"]) for s in range(8)}
    assert len(codes) > 1  # different seeds, different games
    out1 = a.run_trial([{"seed": 7}], ScriptedAgent(mastermind_player), num_rollouts=1)
    out2 = b.run_trial([{"seed": 7}], ScriptedAgent(mastermind_player), num_rollouts=1)
    assert (
        out1["conversations"] == out2["conversations"]
        and out1["padded_full_token_ids"] == out2["padded_full_token_ids"]
    )


def test_concurrent_episodes_stay_reproducible(tokenizer):
    """Games that draw randomness during play (2048 adds tiles) replay identically when run in threads."""
    env = _env(tokenizer, "2048-v0-ultra-easy", max_turns=6)
    agent = ScriptedAgent(["[Left]", "[Up]", "[Right]", "[Down]"])
    tasks = [{"seed": s} for s in (3, 4, 3, 4)]
    together = env.run_trial(tasks, agent, num_rollouts=3)
    alone = [env._run_complete_episode(f"s{i}", agent, t)["messages"] for i, t in enumerate(tasks)]
    convs = together["conversations"]
    for t in range(4):
        assert all(convs[3 * t + r] == alone[t] for r in range(3))
    assert alone[0] == alone[2] and alone[0] != alone[1]


# -- task datasets -------------------------------------------------------------------
def test_train_and_eval_seeds_are_disjoint_and_reproducible(tokenizer):
    env = _env(tokenizer, "Mastermind-v0", seed=3)
    train, eval_ = env.get_train_dataset(200), env.get_eval_dataset(50)
    assert train[0]["env_class_path"] == class_path(TextArenaEnv) == "hf_rollouts.envs.textarena.env.TextArenaEnv"
    assert json.loads(train[0]["env_config"]) == {"env_id": "Mastermind-v0", "seed": 3}
    tr, ev = (
        [t["seed"] for t in map(json.loads, train["task_data"])],
        [t["seed"] for t in map(json.loads, eval_["task_data"])],
    )
    assert len(set(tr)) == 200 and len(set(ev)) == 50 and set(tr).isdisjoint(ev)
    assert [
        t["seed"] for t in map(json.loads, _env(tokenizer, "Mastermind-v0", seed=3).get_train_dataset(20)["task_data"])
    ] == tr[:20]
    assert [
        t["seed"] for t in map(json.loads, _env(tokenizer, "Mastermind-v0", seed=4).get_train_dataset(20)["task_data"])
    ] != tr[:20]
    assert len(_env(tokenizer, "Mastermind-v0", num_eval_tasks=7).get_eval_dataset()) == 7


def test_disjoint_games_option(tokenizer):
    env = _env(tokenizer, "GuessTheNumber-v0", disjoint_games=True, num_eval_tasks=5)

    def numbers(ds):
        return [
            env._initialize_episode("s", t).core.state.game_state["game_number"]
            for t in map(json.loads, ds["task_data"])
        ]

    ev, tr = numbers(env.get_eval_dataset()), numbers(env.get_train_dataset(10))
    assert len(set(ev)) == 5 and len(set(tr)) == 10 and set(ev).isdisjoint(tr)
    with pytest.raises(ValueError, match="distinct train games"):
        env.get_train_dataset(16)  # only 20 numbers exist, 5 are eval's


# -- games that cannot run here ---------------------------------------------------------
@pytest.mark.parametrize(
    ("env_id", "reason"),
    [
        ("TwentyQuestions-v0", "hosted LLM"),
        ("GuessWho-v0", "hosted LLM"),
        ("TicTacToe-v0", "not a single-player game"),
    ],
)
def test_unavailable_games_fail_at_construction(tokenizer, env_id, reason):
    with pytest.raises(TextArenaGameUnavailable, match=reason) as info:
        _env(tokenizer, env_id)
    assert env_id in str(info.value)


@pytest.mark.parametrize("env_id", ["Wordle-v0", "Hangman-v0"])
def test_games_needing_missing_nltk_data_fail_clearly(tokenizer, env_id):
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("corpora/words")
        pytest.skip("NLTK 'words' is installed here, so the game can run")
    except LookupError:
        pass
    with pytest.raises(TextArenaGameUnavailable, match=r"NLTK data \[.*'words'\]") as info:
        _env(tokenizer, env_id)
    assert env_id in str(info.value) and "nltk.downloader" in str(info.value)


def test_bad_configs(tokenizer):
    with pytest.raises(ValueError, match="env_id"):
        TextArenaEnv(tokenizer, {})
    with pytest.raises(ValueError, match="not a registered TextArena game"):
        _env(tokenizer, "NoSuchGame-v0")
    env = _env(tokenizer, "TowerOfHanoi-v0")
    out = env.run_trial([{"level": 1}], ScriptedAgent(["[A C]"]), num_rollouts=1)
    assert out["statuses"] == ["error"] and "seed" in out["errors"][0] and math.isnan(out["final_rewards"][0])


def test_missing_textarena_names_the_extra(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # makes `import textarena` raise ImportError
    with pytest.raises(ImportError, match=re.escape('pip install "hf_rollouts[textarena]"')):
        _env(tokenizer, "Mastermind-v0")


# -- the whole pipeline with a real model ---------------------------------------------------
def test_generate_rollouts_with_a_textarena_game(tokenizer, hf_agent, tmp_path):
    from hf_rollouts.pipeline import generate_rollouts

    tasks = _env(tokenizer, "GuessTheNumber-v0", max_turns=2).get_train_dataset(2)
    ds = generate_rollouts(tasks, hf_agent, 2, seed=0, cache_dir=tmp_path, progress=False)
    assert len(ds) == 2
    for row in ds:
        assert all(s in ("done", "truncated") for s in row["statuses"])
        assert row["padded_logprobs"][0] is not None  # token-exact agent: its ids and log-probs are stored
        assert "Guess The Number" in row["conversations"][0][0]["content"]
