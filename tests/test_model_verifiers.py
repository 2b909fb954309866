"""Verifiers that are models (issue 44): a reward model scored as TRL's GRPOTrainer scores it (checked against a real
GRPOTrainer's ``_calculate_rewards``), batched across episodes; a judge (an agent of the project) with its verdict
parsers, its own seed and "no verdict" as an error; both in a rubric, in env_config, and under the trust rule."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading

import pytest
import torch
from datasets import Dataset

from hf_rollouts import ScriptedAgent, generate_rollouts
from hf_rollouts.aio import ENGINE_LOOP
from hf_rollouts.envs.dataset import DatasetEnv
from hf_rollouts.envs.registry import validate_tasks
from hf_rollouts.schema import TaskValidationError, as_task_dataset
from hf_rollouts.tiny_model import tiny_reward_model_path
from hf_rollouts.verify import (
    Judge,
    MicroBatcher,
    NoVerdictError,
    RewardModel,
    Rubric,
    VerdictParser,
    VerifierConfigError,
    build_verifier,
)

QUESTION = "What is 2 + 2?"
REPLIES = ["4", "It is four.", "I do not know, maybe 5 or 6 or something like that, let me think again", "22"]


def gather(verifier, replies, tasks):
    """``ascore`` of every reply awaited together on the engine's loop (as the env's episodes await them)."""

    async def run():
        return await asyncio.gather(
            *(verifier.ascore(r, None, t) for r, t in zip(replies, tasks)), return_exceptions=True
        )

    return ENGINE_LOOP.call(run())


@pytest.fixture(scope="module")
def rm_path(_cache_dir):
    return str(tiny_reward_model_path(seed=0))


# -- the reward model ----------------------------------------------------------------------------------------------
def test_batched_scores_equal_one_by_one_scores_whatever_the_tokenizers_padding_side(rm_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rm_path, padding_side="left")  # the verifier pads right anyway
    rm = RewardModel(AutoModelForSequenceClassification.from_pretrained(rm_path, num_labels=1), tokenizer)
    task = {"prompt": QUESTION}
    alone = [rm.score(r, None, task) for r in REPLIES]
    together = gather(rm, REPLIES, [task] * len(REPLIES))
    assert rm._batcher.sizes == [len(REPLIES)]  # one forward pass for the four episodes
    for a, b in zip(alone, together):
        assert b.reward == pytest.approx(a.reward, abs=1e-5) and b.info["input_tokens"] == a.info["input_tokens"]
    assert len({round(v.reward, 3) for v in alone}) == len(REPLIES)  # the scores tell the replies apart
    assert alone[0].info["input_tokens"] < alone[2].info["input_tokens"]  # different lengths: padding was needed
    by_path = gather(RewardModel(rm_path), REPLIES, [task] * len(REPLIES))  # the same model, loaded by the verifier
    assert [v.reward for v in by_path] == pytest.approx([v.reward for v in alone], abs=1e-5)


def test_a_raw_score_is_full_marks_only_at_or_above_a_threshold(rm_path):
    """``passed`` means full marks (issue 41): a raw score without a bar never passes, whatever its value."""
    task = {"prompt": QUESTION}
    raw = RewardModel(rm_path).score(REPLIES[0], None, task)
    assert not raw.passed and "no threshold set" in raw.reason and str(raw.reward) in raw.reason
    assert RewardModel(rm_path, threshold=raw.reward).score(REPLIES[0], None, task).passed
    above = RewardModel(rm_path, threshold=raw.reward + 1.0).score(REPLIES[0], None, task)
    assert not above.passed and "below the threshold" in above.reason and above.reward == raw.reward


def test_truncation_keeps_the_end_and_says_so(rm_path):
    long_reply = "Let me explain. " * 20 + "It is 4."
    full = RewardModel(rm_path).score(long_reply, None, {"prompt": QUESTION})
    cut = RewardModel(rm_path, max_length=12).score(long_reply, None, {"prompt": QUESTION})
    assert cut.info["input_tokens"] == 12 and cut.info["truncated_from"] == full.info["input_tokens"] > 12
    assert "truncated_from" not in full.info and cut.reward != full.reward
    model, tokenizer = RewardModel(rm_path).loaded()
    ids = tokenizer(RewardModel(rm_path).text(long_reply, {"prompt": QUESTION}), add_special_tokens=False)["input_ids"]
    with torch.inference_mode():  # the last 12 tokens, scored alone, are what the truncated verdict scored
        expected = model(input_ids=torch.tensor([ids[-12:]], device=model.device)).logits[0, 0].item()
    assert cut.reward == pytest.approx(expected, abs=1e-5)
    with pytest.raises(VerifierConfigError, match="truncation_side"):
        RewardModel(rm_path, truncation_side="middle")


def grpo_rewards(model_path, prompts, replies, conversational, bf16=False):
    """The rewards a real GRPOTrainer's ``_calculate_rewards`` gives with the reward model in ``reward_funcs``
    (``bf16``: GRPOConfig's default, which runs the reward model under a bfloat16 autocast)."""
    pytest.importorskip("trl")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.tiny_model import build_tiny_model

    policy, tok = build_tiny_model(seed=0)
    reward_model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="test_rm_trl_"),
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        bf16=bf16,
    )
    rows = [{"prompt": p} for p in prompts]
    trainer = GRPOTrainer(
        model=policy,
        processing_class=tok,
        args=args,
        train_dataset=Dataset.from_list(rows),
        reward_funcs=[reward_model],
        reward_processing_classes=[AutoTokenizer.from_pretrained(model_path)],
    )
    completions = [[{"role": "assistant", "content": c}] for c in replies] if conversational else replies
    ids = [tok(c, add_special_tokens=False)["input_ids"] for c in replies]
    return [row[0] for row in trainer._calculate_rewards(rows, prompts, completions, ids).tolist()]


@pytest.mark.parametrize("conversational", [True, False])
def test_trl_calculate_rewards_gives_the_same_numbers(rm_path, conversational):
    system = {"role": "system", "content": "Answer briefly."}
    prompts = [[system, {"role": "user", "content": QUESTION}], [{"role": "user", "content": "Name a color."}]] * 2
    if not conversational:
        prompts = ["Q: What is 2 + 2?\nA: ", "Name a color: "] * 2
    through_trl = grpo_rewards(rm_path, prompts, REPLIES, conversational)
    rm = RewardModel(rm_path, conversational=conversational)
    ours = gather(rm, REPLIES, [{"prompt": p} for p in prompts])
    assert [v.reward for v in ours] == pytest.approx(through_trl, abs=1e-5)
    assert len({round(x, 3) for x in through_trl}) == len(REPLIES)
    # GRPOConfig's default bf16=True: TRL's numbers are ours rounded through bfloat16 (a relative 2**-8 per op)
    assert grpo_rewards(rm_path, prompts, REPLIES, conversational, bf16=True) == pytest.approx(through_trl, rel=0.05)


def test_a_reward_model_in_a_rubric_through_the_env_and_env_config(rm_path, tokenizer):
    verifier = [{"name": "exact"}, {"name": "reward_model", "model": rm_path, "weight": 0.5, "threshold": -100.0}]
    rows = [
        {
            "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
            "env_config": {"verifier": verifier},
            "task_data": {"prompt": QUESTION, "answer": "4"},
        }
    ]
    with pytest.raises(TaskValidationError, match="names a model.*'verifier'.*allowed_env_models"):
        validate_tasks(as_task_dataset(rows))
    replies = iter(["4", "5"])
    out = generate_rollouts(
        rows,
        ScriptedAgent(lambda m: next(replies)),
        2,
        tokenizer=tokenizer,
        progress=False,
        allowed_env_models=[rm_path],
        max_concurrency=1,
    )
    scores = [RewardModel(rm_path).score(r, None, {"prompt": QUESTION}).reward for r in ("4", "5")]
    assert out["final_rewards"][0] == pytest.approx([1.0 + 0.5 * scores[0], 0.5 * scores[1]], abs=1e-5)
    assert out["solved"][0] == [True, False]
    turn = json.loads(out["infos"][0][0])
    exact, rm = turn["components"]
    assert (exact["name"], exact["reward"], rm["name"], rm["weight"]) == ("exact", 1.0, "reward_model", 0.5)
    assert rm["info"]["score"] == pytest.approx(scores[0], abs=1e-5) and rm["info"]["input_tokens"] > 5


# -- the judge -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "parser, reply, reward",
    [
        (VerdictParser(), "Yes, it agrees.", 1.0),
        (VerdictParser(), "no. (yes would be wrong)", 0.0),
        (VerdictParser("score", (1, 10)), "I give it 7/10", 6 / 9),
        (VerdictParser("score", (0, 5), pattern=r"score:\s*(\S+)"), "3 points... Score: 5", 1.0),
        (VerdictParser("letter", letters={"A": 1.0, "B": 0.5, "C": 0.0}), "The answer is (B).", 0.5),
        (VerdictParser("letter", pattern=r"VERDICT:\s*(?P<verdict>\w)"), "A or B? VERDICT: B", 0.0),
        (VerdictParser("letter"), "**B**", 0.0),
        (VerdictParser("letter"), "A spider has 8 legs, so the answer is A", 1.0),
        (VerdictParser("letter"), "B) it does not agree", 0.0),
    ],
)
def test_verdict_parsers(parser, reply, reward):
    assert parser.parse(reply)[0] == pytest.approx(reward)


@pytest.mark.parametrize(
    "parser, reply, reason",
    [
        (VerdictParser(), "I cannot tell.", "neither 'yes' nor 'no'"),
        (VerdictParser("score", (1, 10)), "Score: 11", "outside the range"),
        (VerdictParser("score"), "great", "no marked score"),
        (VerdictParser("score"), "Out of 10, this is a 3. Score: 8", "two different verdicts"),
        (VerdictParser("letter"), "Answer: C", "none of the letters"),
        (VerdictParser("letter"), "A spider has six legs.", "none of the letters"),  # "A" the word is no choice
        (VerdictParser("letter"), "The answer is a dog.", "none of the letters"),  # nor "a" after "answer is"
        (VerdictParser("letter"), "answer: b", "none of the letters"),  # the letters as written (was a KeyError)
        (VerdictParser(pattern="VERDICT: (yes|no)"), "yes", "does not match the verdict pattern"),
    ],
)
def test_an_unreadable_reply_is_no_verdict_with_the_reason(parser, reply, reason):
    with pytest.raises(NoVerdictError, match=reason) as caught:
        parser.parse(reply)
    assert caught.value.reply == reply


def fair_judge(messages):
    """A readable judge: yes when the student's answer is the reference, else no; silent on 'mumble'."""
    text = messages[-1]["content"]
    reference = text.split("Reference answer:\n")[1].split("\n")[0]
    student = text.split("Student's answer:\n")[1].split("\n")[0]
    return "hmm" if student == "mumble" else ("Yes." if student.strip() == reference else "No.")


def test_the_judge_in_a_rubric_records_prompt_reply_and_verdict_and_no_verdict_is_an_error(tokenizer):
    judge = ScriptedAgent(fair_judge)
    config = {"verifier": [{"name": "judge", "model": judge}, {"name": "format", "pattern": "^\\d+$", "weight": 0.2}]}
    env = DatasetEnv(tokenizer, config)
    task = {"prompt": QUESTION, "answer": "4"}
    won = env._run_complete_episode("a", ScriptedAgent(["4"]), task, on_error="record")
    lost = env._run_complete_episode("b", ScriptedAgent(["five"]), task, on_error="record")
    mute = env._run_complete_episode("c", ScriptedAgent(["mumble"]), task, on_error="record")
    assert won["final_reward"] == pytest.approx(1.2) and lost["final_reward"] == 0.0
    info = won["turns"][0].info["components"][0]["info"]
    assert info["judge_reply"] == "Yes." and info["verdict"] == "Yes" and info["score"] == 1.0
    assert "Question:\nWhat is 2 + 2?" in info["judge_prompt"] and "Reference answer:\n4" in info["judge_prompt"]
    assert "judge: the judge said 'No'" in lost["turns"][0].info["reason"]
    assert mute["status"] == "error" and "no verdict: neither 'yes' nor 'no'" in mute["error"]
    assert "'hmm'" in mute["error"]  # the judge's reply is in the error, never a 0 reward
    failing = DatasetEnv(tokenizer, {"verifier": {"name": "judge", "model": ScriptedAgent(["x"], fail_at=[0])}})
    broken = failing._run_complete_episode("d", ScriptedAgent(["4"]), task, on_error="record")
    assert broken["status"] == "error" and "the judge failed: RuntimeError" in broken["error"]


def test_judges_sharing_an_agent_share_its_lock_unless_it_is_thread_safe():
    """Judges of several env configs share one cached agent: its ``act_batch`` runs under one lock per agent; an
    agent that says it is ``thread_safe`` (as the LLM gamemaster reads it) takes none."""
    from types import SimpleNamespace

    from hf_rollouts.verify.judge import agent_lock

    shared, other = SimpleNamespace(), SimpleNamespace()
    assert agent_lock(shared) is agent_lock(shared) is not agent_lock(other)
    assert isinstance(agent_lock(shared), type(threading.Lock()))
    assert isinstance(agent_lock(SimpleNamespace(thread_safe=True)), contextlib.nullcontext)


def test_judge_calls_of_many_episodes_are_one_batch(tokenizer):
    agent = ScriptedAgent(fair_judge)
    sizes = []
    inner = agent.act_batch
    agent.act_batch = lambda requests: sizes.append(len(requests)) or inner(requests)
    env = DatasetEnv(tokenizer, {"verifier": {"name": "judge", "model": agent}})
    tasks = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    out = env.run_trial(tasks, ScriptedAgent(lambda m: m[-1]["content"].split()[2]), num_rollouts=2)
    assert sum(sizes) == 12 and max(sizes) > 1 and out["statuses"] == ["done"] * 12  # judged in batches
    assert out["final_rewards"] == [1.0 if i == 0 else 0.0 for i in range(6) for _ in range(2)]


def test_a_real_judge_model_scores_the_same_on_a_rerun_and_whatever_its_batch(_cache_dir):
    """The tiny model as a judge, sampling at temperature 1: each prompt's sample depends on the judge's seed and the
    prompt only, so a rerun, or the same call alone, reads the same reply; another seed reads another."""

    def replies(judge, n):
        task = {"prompt": QUESTION, "answer": "4"}
        out = gather(judge, [str(i) for i in range(n)], [task] * n)
        return [v.info["judge_reply"] if not isinstance(v, Exception) else v.reply for v in out]

    settings = dict(verdict="letter", letters={"a": 1.0, "e": 0.0}, temperature=1.0, max_new_tokens=6)
    first = replies(Judge("tiny", seed=3, **settings), 5)
    assert replies(Judge("tiny", seed=3, **settings), 5) == first
    assert replies(Judge("tiny", seed=3, **settings), 1) == first[:1]
    assert replies(Judge("tiny", seed=4, **settings), 5) != first
    assert len(set(first)) > 1  # sampled, not a constant


def test_judge_options_are_checked_and_models_need_allowing(tokenizer):
    with pytest.raises(VerifierConfigError, match="must use \\{reply\\}"):
        build_verifier({"name": "judge", "model": "tiny", "template": "Is {question} right?"})
    with pytest.raises(VerifierConfigError, match="give reference_key"):
        build_verifier({"name": "judge", "model": "tiny", "reference_key": None})
    with pytest.raises(VerifierConfigError, match="verdict is one of"):
        build_verifier({"name": "judge", "model": "tiny", "verdict": "stars"})
    no_reference = Judge("tiny", template="Is this a polite reply? {reply}\nyes or no:", reference_key=None)
    no_reference.check_task({"prompt": "Hi"})  # no reference needed
    spec = [{"name": "judge", "model": "openai:http://127.0.0.1:9/v1#judge", "tokenizer": "./judge-tok"}]
    assert Rubric.models_in(spec) == ["openai:http://127.0.0.1:9/v1#judge", "./judge-tok"]
    row = {
        "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
        "env_config": {"verifier": [{"name": "exact"}, {"name": "judge", "model": "smollm2"}]},
        "task_data": {"prompt": "q", "answer": "a"},
    }
    with pytest.raises(TaskValidationError, match="'verifier': 'smollm2'.*--allow-env-model 'smollm2'"):
        validate_tasks(as_task_dataset([row]))
    assert validate_tasks(as_task_dataset([row]), allowed_env_models=["smollm2"])


def test_the_micro_batcher_fails_only_the_calls_that_failed():
    def run(items):
        if "boom" in items:
            raise RuntimeError("the batch failed")
        return [ValueError(x) if x == "bad" else x.upper() for x in items]

    batcher = MicroBatcher(run, max_batch=2)

    async def calls(*items):
        return await asyncio.gather(*(batcher(x) for x in items), return_exceptions=True)

    out = ENGINE_LOOP.call(calls("a", "bad", "c"))
    assert out[0] == "A" and isinstance(out[1], ValueError) and out[2] == "C" and batcher.sizes == [2, 1]
    out = ENGINE_LOOP.call(calls("x", "boom"))
    assert all(isinstance(x, RuntimeError) for x in out)


def test_the_guide_section_prints_what_it_shows(tmp_path, monkeypatch):
    """docs/guides/datasets.md, "Scored by a model": its example runs and prints what the page shows."""
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "datasets.md").read_text()
    marker = "<!-- run by tests/test_model_verifiers.py::test_the_guide_section_prints_what_it_shows -->"
    shape = r"\n```python\n(.*?)^```\n\nprints.*?\n\n```text\n(.*?)^```"
    found = re.search(re.escape(marker) + shape, page, re.S | re.M)
    code, shown = found.groups()
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "datasets.md: Scored by a model", "exec"), {"__name__": "guide_scored_by_a_model"})
    assert out.getvalue() == shown


def test_cli_tasks_with_a_reward_model_then_generate_only_when_the_model_is_allowed(rm_path, tmp_path, capsys):
    from datasets import load_from_disk

    from hf_rollouts.cli import main

    source = tmp_path / "qa.jsonl"
    source.write_text("\n".join(json.dumps({"question": q, "answer": "x"}) for q in ("Why is the sky blue?", "Hi?")))
    rule = {"name": "format", "pattern": "\\.$", "weight": 0.5}
    spec = json.dumps([{"name": "reward_model", "model": rm_path}, rule])
    argv = ["tasks", "--from-dataset", str(source), "--prompt-column", "question", "--verifier", spec]
    assert main([*argv, "--output", str(tmp_path / "t")]) == 0
    generate = ["generate", "--tasks", str(tmp_path / "t"), "--model", "tiny", "--num-rollouts", "2"]
    generate += ["--max-new-tokens", "8", "--cache-dir", str(tmp_path / "c"), "--output"]
    assert main([*generate, str(tmp_path / "refused")]) == 2
    assert "names a model" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    assert main([*generate, str(tmp_path / "o"), "--allow-env-model", rm_path]) == 0
    out = load_from_disk(str(tmp_path / "o"))
    assert all(s == ["done", "done"] for s in out["statuses"])
    for row in out:
        for info, reward in zip(row["infos"], row["final_rewards"]):
            model_part, rule = json.loads(info)["components"]
            assert reward == pytest.approx(model_part["reward"] + 0.5 * rule["reward"], abs=1e-5)
            assert model_part["name"] == "reward_model" and model_part["info"]["input_tokens"] > 5


def test_a_judge_behind_the_loopback_server_reads_what_the_local_judge_reads(_cache_dir):
    """The tiny model as a judge served by the loopback vLLM-protocol server (a per-request agent, each call awaited
    on the loop as it comes) and loaded locally (batched): greedy, the same prompts give the same judge replies; every
    request carries the judge's own seed for its prompt. The server gets its own fresh copy of the weights the local
    judge loads (the session's shared ``tiny`` model may have been trained in place by an earlier test)."""
    from vllm_protocol_server import VLLMProtocolServer

    from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path

    model, tokenizer = build_tiny_model(seed=0)
    task = {"prompt": QUESTION, "answer": "4"}

    def replies(judge):
        return [
            v.reply if isinstance(v, NoVerdictError) else v.info["judge_reply"]
            for v in gather(judge, REPLIES, [task] * 4)
        ]

    local = Judge("tiny", max_new_tokens=6)
    with VLLMProtocolServer(model, tokenizer) as server:
        served = Judge(f"openai:{server.url}#tiny", tokenizer=str(tiny_model_path(0)), max_new_tokens=6)
        assert served.agent().answers_per_request and not local.agent().answers_per_request
        from_server = replies(served)
        seeds = [entry["body"].get("seed") for entry in server.log if entry["body"].get("max_tokens") == 6]
    assert from_server == replies(local) and any(from_server)
    expected = [served.agent().request_seed(served.request(served.prompt(r, None, task))) for r in REPLIES]
    assert sorted(seeds) == sorted(expected) and len(set(expected)) == 4
