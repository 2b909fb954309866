"""Rescoring stored rollouts (issue 50): ``rescore_rollouts`` and ``hf-rollouts rescore`` score the rollouts of the
dataset env, made once with the tiny model, again with math-verify, the tiny reward model and a hosted judge (the
loopback chat server), without running the policy: new scores replace the old, which are kept under a prefix; the
token columns never change; the new verifier's errors are per-rollout errors, never zeros; an ``error`` rollout whose
reply was never scored is kept; what a spec names is under the trust rule."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from chat_only_server import ChatOnlyServer
from datasets import Dataset, load_from_disk

from hf_rollouts import ScriptedAgent, generate_rollouts
from hf_rollouts.agents import SamplingConfig, load_agent
from hf_rollouts.aio import ENGINE_LOOP
from hf_rollouts.envs.dataset import to_task_rows
from hf_rollouts.rescore import rescore_rollouts, rescore_summary
from hf_rollouts.schema import TaskValidationError
from hf_rollouts.tiny_model import tiny_reward_model_path
from hf_rollouts.verify import MathVerifier, RewardModel, last_number

TOKEN_COLUMNS = ("padded_full_token_ids", "padded_agent_token_mask", "padded_logprobs", "conversations", "num_turns")


@pytest.fixture(scope="module")
def stored(_cache_dir, tmp_path_factory):
    """DatasetEnv rollouts of the tiny model (8 questions x 2, the last number as the answer, scored by 'exact')."""
    questions = Dataset.from_list([{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(8)])
    tasks = to_task_rows(
        questions,
        prompt_column="q",
        answer_column="a",
        env_config={"verifier": "exact", "extraction": "last_number"},
    )
    agent = load_agent("tiny", SamplingConfig(max_new_tokens=12))
    cache = str(tmp_path_factory.mktemp("rescore_cache"))
    return generate_rollouts(tasks, agent, num_rollouts=2, seed=0, progress=False, cache_dir=cache), agent.tokenizer


def replies(ds):
    return [[c[-1]["content"] for c in row["conversations"]] for row in ds]


def with_reference(ds, row, answer):
    """``ds`` with task ``row``'s reference replaced (a reference fixed after the run, what rescoring is for)."""

    def fix(example, i):
        if i == row:
            data = json.loads(example["task_data"])
            example["task_data"] = json.dumps({**data, "answer": answer})
        return example

    return ds.map(fix, with_indices=True)


def check_rewards_on_tokens(out):
    for row in out:
        for k, reward in enumerate(row["final_rewards"]):
            mask, per_token = row["padded_agent_token_mask"][k], row["padded_per_token_rewards"][k]
            if math.isnan(reward):
                assert not any(per_token)
                continue
            assert sum(per_token) == pytest.approx(reward, abs=1e-6)
            assert all(m == 1 for m, r in zip(mask, per_token) if r != 0.0)  # rewards only on agent tokens
            last = max(i for i, m in enumerate(mask) if m)
            assert per_token[last] == pytest.approx(reward, abs=1e-6)  # the default placement: the last agent token


def test_math_rescore_replaces_the_scores_keeps_the_old_ones_and_never_the_tokens(stored):
    ds, _ = stored
    answers = [[json.loads(i)["answer"] for i in row["infos"]] for row in ds]
    row = next(r for r, found in enumerate(answers) if any(found))  # a reply that wrote a number
    k = next(k for k, a in enumerate(answers[row]) if a)
    ds = with_reference(ds, row, answers[row][k])
    out = rescore_rollouts(ds, "math")
    math_verifier = MathVerifier()
    for r, (texts, task_json) in enumerate(zip(replies(out), out["task_data"])):
        task = json.loads(task_json)
        expected = [math_verifier.score(t, last_number(t), task) for t in texts]
        assert out["final_rewards"][r] == [v.reward for v in expected]
        assert out["solved"][r] == [v.passed for v in expected]
        for info, verdict in zip(out["infos"][r], expected):
            info = json.loads(info)
            assert info["components"][0]["name"] == "math" and info["reason"] == (
                None if verdict.passed else f"math: {verdict.reason}"
            )
    assert out["final_rewards"][row][k] == 1.0 and out["solved"][row][k] is True  # the fixed reference
    for column in TOKEN_COLUMNS:
        assert out[column] == ds[column]
    for column in ("final_rewards", "padded_per_token_rewards", "solved", "infos", "statuses", "errors"):
        assert out[f"previous_{column}"] == ds[column]
    assert ds["final_rewards"][row][k] == 0.0  # 'exact' against the old reference
    assert out["rescored"] == [[True, True]] * 8 and out["statuses"] == ds["statuses"]
    check_rewards_on_tokens(out)
    summary = rescore_summary(out)
    assert (summary["rollouts"], summary["rescored"], summary["errors"], summary["kept"]) == (16, 16, 0, 0)
    assert summary["mean_final_reward"] == pytest.approx(1 / 16) and summary["previous_mean_final_reward"] == 0.0


def test_the_tiny_reward_model_rescores_the_same_rollouts_as_it_scores_them_alone(stored):
    ds, _ = stored
    path = str(tiny_reward_model_path(seed=0))
    spec = {"name": "reward_model", "model": path}
    with pytest.raises(TaskValidationError, match="--allow-env-model"):
        rescore_rollouts(ds, spec)  # a model named by the spec is loaded only when allowed
    out = rescore_rollouts(ds, spec, allowed_env_models=[path])
    alone = RewardModel(path)

    async def scores(texts, task):
        return await asyncio.gather(*(alone.ascore(t, None, task) for t in texts))

    for r, (texts, task_json) in enumerate(zip(replies(ds), ds["task_data"])):
        task = {**json.loads(task_json)}
        expected = ENGINE_LOOP.call(scores(texts, task))
        assert out["final_rewards"][r] == pytest.approx([v.reward for v in expected], abs=1e-5)
    assert all(s == ["done", "done"] for s in out["statuses"]) and out["solved"] == [[False, False]] * 8
    assert len({round(x, 4) for row in out["final_rewards"] for x in row}) > 4  # raw scores, not a constant
    check_rewards_on_tokens(out)


def test_a_judge_that_gives_no_verdict_makes_errors_never_zeros(stored):
    ds, _ = stored

    def judge(messages):
        text = messages[-1]["content"]
        if "Student's answer:" not in text:
            return "Hello"
        student = text.split("Student's answer:\n")[1].split("\n\n")[0]
        return "Yes." if any(c.isdigit() for c in student) else "I cannot tell."

    with ChatOnlyServer(judge) as server:
        spec = {"name": "judge", "model": f"openai:{server.url}#judge-1"}
        out = rescore_rollouts(ds, spec, allowed_env_models=[spec["model"]])
    digits = [[any(c.isdigit() for c in t) for t in texts] for texts in replies(ds)]
    assert any(map(any, digits))
    for r, row in enumerate(out):
        for k, has_digit in enumerate(digits[r]):
            if has_digit:
                assert (row["statuses"][k], row["final_rewards"][k], row["solved"][k]) == ("done", 1.0, True)
            else:
                assert row["statuses"][k] == "error" and math.isnan(row["final_rewards"][k])
                assert row["solved"][k] is False and "NoVerdictError: no verdict" in row["errors"][k]
                assert json.loads(row["infos"][k])["error"] == row["errors"][k]
            assert row["previous_statuses"][k] == "done" and row["rescored"][k]
    check_rewards_on_tokens(out)
    summary = rescore_summary(out)
    assert summary["errors"] == sum(not d for row in digits for d in row) > 0


def test_an_error_of_the_verifier_is_rescored_and_an_error_of_the_agent_is_kept(tokenizer, tmp_path):
    """Rollouts whose original judge gave no verdict (the reply was complete) are rescored; one whose agent failed
    (no reply scored) is kept as it was, NaN and its error."""

    def judge(messages):
        text = messages[-1]["content"]
        return "hmm" if "mumble" in text else "Yes." if "Student's answer:\n4" in text else "No."

    questions = Dataset.from_list([{"q": "What is 2 + 2?", "a": "4"}, {"q": "Say something.", "a": "x"}])
    with ChatOnlyServer(judge) as server:
        model = f"openai:{server.url}#judge-1"
        tasks = to_task_rows(
            questions, prompt_column="q", answer_column="a", env_config={"verifier": {"name": "judge", "model": model}}
        )
        policy = ScriptedAgent(lambda m: "4" if "2 + 2" in m[-1]["content"] else "mumble", fail_at=[0])
        ds = generate_rollouts(
            tasks,
            policy,
            num_rollouts=2,
            seed=0,
            tokenizer=tokenizer,
            progress=False,
            cache_dir=str(tmp_path),
            allowed_env_models=[model],
        )
    errors = [e for row in ds["errors"] for e in row if e]
    assert sum("scripted failure" in e for e in errors) == 1  # the agent failed once
    assert sum("no verdict" in e for e in errors) >= 1  # the original judge could not read "mumble"
    out = rescore_rollouts(ds, "exact")
    for r, row in enumerate(out):
        for k in range(2):
            agent_failed = row["previous_infos"][k] is None
            assert row["rescored"][k] is not agent_failed
            if agent_failed:
                assert row["statuses"][k] == "error" and math.isnan(row["final_rewards"][k])
                assert row["errors"][k] == row["previous_errors"][k] and "scripted failure" in row["errors"][k]
            else:
                assert row["statuses"][k] == "done" and row["errors"][k] is None
                assert row["final_rewards"][k] == (1.0 if r == 0 else 0.0)
    assert rescore_summary(out)["kept"] == 1


def test_the_trust_rule_and_bad_input_are_refused_before_any_scoring(stored):
    ds, tok = stored
    trl = {"name": "trl", "function": "hfr_rewards.short_completion"}
    with pytest.raises(TaskValidationError, match="allowed_env_modules=\\['hfr_rewards'\\]"):
        rescore_rollouts(ds, trl)
    out = rescore_rollouts(ds, trl, tokenizer=tok, allowed_env_modules=["hfr_rewards"])
    lengths = [[len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts] for texts in replies(ds)]
    assert out["final_rewards"] == [[pytest.approx(1 / (1 + n)) for n in row] for row in lengths]
    unbound = rescore_rollouts(ds, trl, allowed_env_modules=["hfr_rewards"])  # completion_ids None: the function fails
    assert all(s == "error" for row in unbound["statuses"] for s in row)
    assert "RewardFunctionError" in unbound["errors"][0][0] and math.isnan(unbound["final_rewards"][0][0])
    other = ds.map(lambda e: {"env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv", "env_config": "{}"})
    with pytest.raises(TaskValidationError, match="row 0: rescoring scores DatasetEnv rows"):
        rescore_rollouts(other, "exact")
    no_reference = ds.map(
        lambda e, i: {"task_data": json.dumps({"prompt": "q"}) if i == 3 else e["task_data"]}, with_indices=True
    )
    with pytest.raises(TaskValidationError, match="row 3, field 'task_data', key 'answer'"):
        rescore_rollouts(no_reference, "exact")
    with pytest.raises(TaskValidationError, match="already have.*keep_prefix"):
        rescore_rollouts(out, "exact")
    again = rescore_rollouts(out, "exact", keep_prefix="rescore2_")
    assert (
        again["rescore2_final_rewards"] == out["final_rewards"]
        and again["previous_final_rewards"] == ds["final_rewards"]
    )


def test_the_cli_writes_the_rescored_dataset_its_card_and_tokenizer(stored, tmp_path, capsys):
    from hf_rollouts.cli import main
    from hf_rollouts.publish import save_rollouts

    ds, tok = stored
    source = save_rollouts(ds, tmp_path / "rollouts")
    tok.save_pretrained(str(source / "tokenizer"))
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n# My rollouts\n\nMade by a run.\n")
    out = tmp_path / "rescored"
    assert main(["rescore", str(source), "--verifier", '{"name": "math"}', "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rescored 16 of 16 rollouts (0 errors of the new verifier, 0 kept)" in printed
    rescored = load_from_disk(str(out))
    assert rescored["previous_final_rewards"] == ds["final_rewards"] and "rescored" in rescored.column_names
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0") and "Made by a run." in card
    assert "## Rescored" in card and '{"name": "math"}' in card and "`previous_final_rewards`" in card
    assert (out / "tokenizer" / "tokenizer.json").is_file() and list((out / "parquet").glob("*.parquet"))
    judge = '{"name": "judge", "model": "smollm2"}'
    assert main(["rescore", str(source), "--verifier", judge, "--output", str(tmp_path / "no")]) == 2
    assert "--allow-env-model 'smollm2'" in capsys.readouterr().err
    assert main(["rescore", str(out), "--verifier", "exact", "--output", str(tmp_path / "twice")]) == 2
    assert "--keep-prefix" in capsys.readouterr().err
    assert main(["rescore", str(source), "--verifier", "{bad", "--output", str(tmp_path / "bad")]) == 2


def test_a_later_try_keeps_its_discount_and_a_spread_reward_lands_on_the_last_turn(tokenizer, tmp_path):
    """max_turns 2 and retry_discount 0.5: a reply right on its second try scores 0.5 under the new verifier too;
    reward_placement 'spread' spreads it over that try's tokens only (the first try's get 0)."""
    questions = Dataset.from_list([{"q": "What is 2 + 2?", "a": "4"}])
    config = {"verifier": "exact", "max_turns": 2, "retry_discount": 0.5, "reward_placement": "spread"}
    tasks = to_task_rows(questions, prompt_column="q", answer_column="a", env_config=config)
    ds = generate_rollouts(
        tasks,
        ScriptedAgent(["5", "4.0"]),
        num_rollouts=1,
        seed=0,
        tokenizer=tokenizer,
        progress=False,
        cache_dir=str(tmp_path),
    )
    assert ds["final_rewards"] == [[0.0]] and ds["num_turns"] == [[2]]  # 'exact': "4.0" is not "4"
    out = rescore_rollouts(ds, "numeric")
    assert out["final_rewards"] == [[0.5]] and out["solved"] == [[True]] and json.loads(out["infos"][0][0])["try"] == 2
    mask, rewards = out["padded_agent_token_mask"][0][0], out["padded_per_token_rewards"][0][0]
    agent = [i for i, m in enumerate(mask) if m]
    start = agent[-1]
    while mask[start - 1]:
        start -= 1
    last_turn = list(range(start, agent[-1] + 1))  # the last run of agent tokens: the second try
    first_turn = [i for i in agent if i < start]
    assert first_turn and all(rewards[i] == 0.0 for i in first_turn)
    assert all(rewards[i] == pytest.approx(0.5 / len(last_turn)) for i in last_turn)
    assert sum(rewards) == pytest.approx(0.5)


def test_a_rescored_dataset_verifies_by_its_recorded_rescore_and_a_hand_edit_is_still_caught(stored, tmp_path):
    """The rescore is recorded in the run record it carries on (``rescores``); ``verify --rewards-only`` replays the
    rewards with the last rescore's verifier (the rows' own would call every changed reward a mismatch), and a
    rescored reward edited by hand is still named by the row hashes."""
    import shutil

    from hf_rollouts.provenance import FILE, verify_rollouts
    from hf_rollouts.publish import save_rollouts
    from hf_rollouts.run_record import read_run_record

    ds, tok = stored
    trl = {"name": "trl", "function": "hfr_rewards.short_completion"}
    out = rescore_rollouts(ds, trl, tokenizer=tok, allowed_env_modules=["hfr_rewards"])
    assert out["final_rewards"] != out["previous_final_rewards"]  # the new verifier scored them otherwise
    (entry,) = read_run_record(out)["rescores"]
    assert entry["verifier"] == trl and entry["keep_prefix"] == "previous_" and entry["replayable"] is True
    assert read_run_record(out)["envs"] == read_run_record(ds)["envs"]  # the run's record carried on
    saved = save_rollouts(out, tmp_path / "rescored")
    with pytest.raises(TaskValidationError, match="hfr_rewards"):  # the recorded spec is trusted as a row's is
        verify_rollouts(saved, None, tokenizer=tok, sample=8, rewards_only=True)
    report = verify_rollouts(
        saved, None, tokenizer=tok, sample=8, rewards_only=True, allowed_env_modules=["hfr_rewards"]
    )
    assert report.exit_code == 0 and not report.mismatches, report.text()
    assert any("last rescore" in c and "short_completion" in c for c in report.checked), report.text()

    edited = out.map(
        lambda r, i: {
            "final_rewards": [r["final_rewards"][0] + 0.5, *r["final_rewards"][1:]] if i == 2 else r["final_rewards"]
        },
        with_indices=True,
        features=out.features,
    )
    tampered = tmp_path / "tampered"
    edited.save_to_disk(str(tampered))
    shutil.copy(saved / FILE, tampered / FILE)
    report = verify_rollouts(
        tampered, None, tokenizer=tok, sample=8, rewards_only=True, allowed_env_modules=["hfr_rewards"]
    )
    assert report.exit_code == 1
    hashes = [m for m in report.mismatches if m.field.startswith("row hash")]
    assert [m.row for m in hashes] == [2] and "final_rewards" in hashes[0].field, report.text()
    assert [(m.row, m.rollout) for m in report.mismatches if m.field == "final reward"] == [(2, 0)]


def test_a_rescore_that_cannot_be_replayed_is_unverifiable_never_a_mismatch(stored, tmp_path):
    from hf_rollouts.provenance import verify_rollouts
    from hf_rollouts.publish import save_rollouts

    ds, tok = stored
    out = rescore_rollouts(ds, MathVerifier())  # an object: no spec to build it again
    saved = save_rollouts(out, tmp_path / "rescored")
    report = verify_rollouts(saved, None, tokenizer=tok, sample=8, rewards_only=True)
    assert report.exit_code == 3 and not report.mismatches, report.text()
    assert any(u.startswith("rewards: rescored by") and "verifier object" in u for u in report.unverifiable)
    twice = rescore_rollouts(rescore_rollouts(ds, "math"), "exact", keep_prefix="again_")
    from hf_rollouts.run_record import read_run_record

    assert [e["verifier"] for e in read_run_record(twice)["rescores"]] == ["math", "exact"]


def test_a_try_that_is_not_an_int_is_no_try():
    from hf_rollouts.rescore.core import tried

    assert tried('{"try": 1}') == 1 and tried('{"try": 3}') == 3
    assert tried('{"try": true}') is None and tried('{"try": 1.0}') is None and tried('{"try": 0}') is None


def test_a_strangers_bad_template_or_backtracking_pattern_is_refused_or_an_error(stored):
    ds, _ = stored
    wide = ds.map(
        lambda e, i: {"env_config": json.dumps({**json.loads(e["env_config"]), "feedback": "{reason:>999999999}"})}
        if i == 5 else {}, with_indices=True,
    )  # fmt: skip
    with pytest.raises(TaskValidationError, match="row 5.*feedback.*width or precision over 10000"):
        rescore_rollouts(wide, "exact")
    pattern = {"extraction": "regex", "extraction_pattern": "(a+)+$"}
    crafted = ds.map(
        lambda e: {
            "env_config": json.dumps({**json.loads(e["env_config"]), **pattern}),
            "conversations": [
                [*c[:-1], {"role": "assistant", "content": "a" * 5000 + "b"}] for c in e["conversations"]
            ],
        }
    )
    out = rescore_rollouts(crafted.select([0]), "exact")
    assert out["statuses"] == [["error", "error"]] and out["rescored"] == [[True, True]]
    assert "ExtractionTimeout" in out["errors"][0][0] and all(math.isnan(x) for x in out["final_rewards"][0])


def test_an_alias_bomb_card_is_refused_before_any_scoring(stored, tmp_path, capsys):
    from hf_rollouts.cli import main
    from hf_rollouts.publish import save_rollouts

    ds, _ = stored
    source = save_rollouts(ds, tmp_path / "rollouts")
    bomb = "---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b]\n---\n"
    (source / "README.md").write_text(bomb)
    assert main(["rescore", str(source), "--verifier", "math", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "README.md" in err and "uses an alias (*a, line 3)" in err, err
    assert not (tmp_path / "out" / "dataset_info.json").exists()
