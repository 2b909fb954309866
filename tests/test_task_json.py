"""Task rows come back exactly as given (issue 41, item 4; issue 46, item 2): ``env_config`` / ``task_data`` are stored
as JSON text by an exact codec (hf_rollouts.task_json), through every storage and every run path. The matrix: each
storage below x every value kind of ``VALUES``, compared by type and ``repr`` (so ``-0.0`` is not ``0.0``)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from datasets import Dataset, Features, Json, Value, load_dataset, load_from_disk
from huggingface_hub import HfApi

from hf_rollouts import generate_rollouts
from hf_rollouts.agents import ScriptedAgent
from hf_rollouts.cli import main
from hf_rollouts.envs.config import UnknownConfigKeyWarning
from hf_rollouts.envs.dataset import TaskRows, to_task_rows
from hf_rollouts.mapping import rollout_map
from hf_rollouts.publish import push_rollouts, save_rollouts
from hf_rollouts.publish.save import parquet_files
from hf_rollouts.schema import TASK_FEATURES, TaskValidationError, as_task_dataset, to_task_dataset
from hf_rollouts.task_json import TaskValueError, decode_task_value, encode_task_value

GUESS = "hf_rollouts.envs.guess_number.GuessNumberEnv"
VALUES = {
    "third": 1 / 3,
    "tiny": 1e-300,
    "subnormal": 5e-324,
    "neg_zero": -0.0,
    "float_max": 1.7976931348623157e308,
    "big": 2**70,
    "neg_big": -(2**100),
    "int64_max": 2**63 - 1,
    "nested": {"a": [1, [2.5, {"b": None}], {}], "z": {"y": {"x": [True, False]}}},
    "unicode": "naïve ☃ 𝄞 中文",
    "surrogate": "\ud800",
    "none": None,
    "empty_dict": {},
    "empty_list": [],
    "empty_str": "",
}
"""Every value kind of the round-trip matrix, in one task_data (key order kept: it is part of "as given")."""


def same(a, b) -> bool:
    """Equal in type and value, floats to the bit (``-0.0`` is not ``0.0``), dict key order included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and a.hex() == b.hex()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def task_rows(n: int = 2) -> list[dict]:
    return [
        {"env_class_path": GUESS, "env_config": {"low": 1, "high": 4}, "task_data": {"target": 2 + i, **VALUES}}
        for i in range(n)
    ]


def assert_exact(task_data_column, env_configs=None, n: int = 2) -> None:
    expected = task_rows(n)
    got = [decode_task_value(t) for t in task_data_column]
    assert len(got) == n
    for want, have in zip(expected, got):
        assert same(want["task_data"], have), (want["task_data"], have)
    for want, have in zip(expected, env_configs or []):
        assert same(want["env_config"], decode_task_value(have))


def test_the_codec_is_exact_for_every_value_kind():
    text = encode_task_value(task_rows(1)[0]["task_data"])
    assert same(json.loads(text), task_rows(1)[0]["task_data"])
    assert same(decode_task_value(text), task_rows(1)[0]["task_data"])
    assert "0.3333333333333333" in text and "1180591620717411303424" in text and "-0.0" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": {"y": float("nan")}}, r"row 0: field 'task_data': \['x'\]\['y'\] is nan; JSON has no NaN"),
        ({"x": [1, float("-inf")]}, r"\['x'\]\[1\] is -inf"),
        ({"x": {1: "a"}}, r"\['x'\] has the key 1 \(int\); JSON keys are strings"),
        ({"x": {1, 2}}, r"\['x'\] is a set \(\{1, 2\}\), which JSON cannot hold"),
        ({"x": b"raw"}, r"\['x'\] is a bytes \(b'raw'\)"),
    ],
)
def test_what_json_cannot_hold_exactly_is_refused_naming_the_row_path_and_value(value, message):
    with pytest.raises(TaskValidationError, match=message):
        to_task_dataset([{"env_class_path": GUESS, "env_config": {}, "task_data": value}])


def test_a_dict_with_a_big_int_is_stored_not_refused_as_a_str():
    """Was: ``row 0: field 'task_data' must be a dict, got str`` (Json() turned it into text)."""
    ds = to_task_dataset([{"env_class_path": GUESS, "env_config": {}, "task_data": {"target": 2, "big": 2**70}}])
    assert json.loads(ds[0]["task_data"]) == {"target": 2, "big": 2**70}


def test_in_memory_disk_parquet_and_hub_files(tmp_path, monkeypatch):
    ds = to_task_dataset(task_rows())
    assert ds.features == TASK_FEATURES
    assert_exact(ds["task_data"], ds["env_config"])  # to_task_dataset
    ds.save_to_disk(str(tmp_path / "disk"))
    back = load_from_disk(str(tmp_path / "disk"))
    assert_exact(back["task_data"], back["env_config"])  # save_to_disk / load_from_disk
    ds.to_parquet(str(tmp_path / "t.parquet"))
    parquet = load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert parquet.features == TASK_FEATURES
    assert_exact(parquet["task_data"], parquet["env_config"])  # parquet
    written = []

    def upload(self, repo_id, **kwargs):  # the network boundary: the files push_to_hub would upload
        path = tmp_path / "hub" / "data" / "train-00000-of-00001.parquet"
        path.parent.mkdir(parents=True)
        self.to_parquet(str(path))
        written.append(path)

    monkeypatch.setattr(Dataset, "push_to_hub", upload)
    files = []  # the other network call: the provenance file push_rollouts uploads beside the data
    monkeypatch.setattr(HfApi, "upload_file", lambda self, **kw: files.append(kw["path_in_repo"]))
    push_rollouts(ds, "me/tasks")
    assert files == ["provenance.json"]
    hub = load_dataset("parquet", data_files=str(written[0]), split="train")
    assert_exact(hub["task_data"], hub["env_config"])  # push_to_hub's files


def test_to_task_rows_and_task_rows_map_keep_values_exactly():
    source = Dataset.from_list([{"q": "Pick.", "a": "2"}, {"q": "Pick again.", "a": "3"}])
    config = {"verifier": "exact", "max_reward": 1 / 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownConfigKeyWarning)
        rows = to_task_rows(source, prompt_column="q", answer_column="a", env_config=config)
        mapped = source.map(TaskRows(prompt_column="q", answer_column="a", env_config=config), with_indices=True)
    for ds in (rows, mapped):
        assert same(json.loads(ds[0]["env_config"])["max_reward"], 1 / 3)  # was 0.33333333330000003


def test_generate_rollout_map_and_save_rollouts_keep_task_rows_exactly(tokenizer, tmp_path):
    tasks = to_task_dataset(task_rows())
    out = generate_rollouts(
        tasks, ScriptedAgent(["2"]), 1, tokenizer=tokenizer, cache_dir=tmp_path / "c", progress=False
    )
    assert out["statuses"][0] == ["done"]  # played: the env read the row (target 2, guessed 2)
    assert_exact(out["task_data"], out["env_config"])  # generate_rollouts
    fn = rollout_map(ScriptedAgent(["2"]), 1, tokenizer=tokenizer)
    mapped = tasks.map(fn, batched=True, batch_size=16, with_indices=True, features=fn.features(tasks))
    assert_exact(mapped["task_data"], mapped["env_config"])  # rollout_map
    save_rollouts(out, tmp_path / "o")
    assert_exact(load_from_disk(str(tmp_path / "o"))["task_data"])
    assert_exact(load_dataset("parquet", data_files=parquet_files(tmp_path / "o"), split="train")["task_data"])


def test_an_empty_env_config_of_dict_rows_saves_loads_and_pushes(tokenizer, tmp_path, monkeypatch):
    """Issue 46, item 2: ``Dataset.from_list`` makes ``{}`` a struct with no field, which parquet cannot write."""
    rows = [{"env_class_path": GUESS, "env_config": {}, "task_data": {"target": 2}}]
    tasks = Dataset.from_list(rows)
    out = generate_rollouts(
        tasks, ScriptedAgent(["2"]), 1, tokenizer=tokenizer, cache_dir=tmp_path / "c", progress=False
    )
    fn = rollout_map(ScriptedAgent(["2"]), 1, tokenizer=tokenizer)
    mapped = tasks.map(fn, batched=True, with_indices=True, features=fn.features(tasks))  # keeps the struct
    for i, ds in enumerate((out, mapped)):
        save_rollouts(ds, tmp_path / f"o{i}")
        back = load_dataset("parquet", data_files=parquet_files(tmp_path / f"o{i}"), split="train")
        assert json.loads(back[0]["env_config"]) == {} and json.loads(back[0]["task_data"]) == {"target": 2}
    monkeypatch.setattr(Dataset, "push_to_hub", lambda self, repo_id, **kw: self.to_parquet(str(tmp_path / "h.pq")))
    monkeypatch.setattr(HfApi, "upload_file", lambda self, **kw: None)  # the provenance file (the network boundary)
    push_rollouts(mapped, "me/r")
    assert json.loads(load_dataset("parquet", data_files=str(tmp_path / "h.pq"), split="train")[0]["env_config"]) == {}


def old_json_dataset() -> Dataset:
    """A task dataset as hf_rollouts wrote it before (``datasets.Json()`` columns), built with the old features."""
    rows = [
        {"env_class_path": GUESS, "env_config": {"low": 1, "high": 4}, "task_data": {"target": 2, "w": 1 / 3}},
        {"env_class_path": GUESS, "env_config": {}, "task_data": {"target": 3, "big": 2**70}},
    ]
    old = Features({"env_class_path": Value("string"), "env_config": Json(), "task_data": Json()})
    return Dataset.from_list(rows, features=old)


def test_datasets_written_with_json_columns_still_load_and_play(tokenizer, tmp_path):
    old_json_dataset().save_to_disk(str(tmp_path / "old"))
    old = load_from_disk(str(tmp_path / "old"))
    assert type(old.features["task_data"]).__name__ == "Json"
    converted = as_task_dataset(old)
    assert converted.features == TASK_FEATURES
    # what Json() kept: 10 digits of 1/3 (read exactly from its text), and the big int it stored as a quoted string
    assert [json.loads(t) for t in converted["task_data"]] == [
        {"target": 2, "w": 0.3333333333},
        {"target": 3, "big": 2**70},
    ]
    out = generate_rollouts(old, ScriptedAgent(["2"]), 1, tokenizer=tokenizer, cache_dir=tmp_path / "c", progress=False)
    assert len(out) == 2 and out.features["task_data"] == Value("string")


def test_the_cli_keeps_task_rows_exactly(tmp_path):
    to_task_dataset(task_rows()).save_to_disk(str(tmp_path / "tasks"))
    args = ["generate", "--tasks", str(tmp_path / "tasks"), "--num-rollouts", "1", "--max-new-tokens", "4"]
    assert main([*args, "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]) == 0
    out = load_from_disk(str(tmp_path / "o"))
    assert_exact(out["task_data"], out["env_config"])
    config = json.dumps({"max_turns": 2, "seed": 2**70})
    assert (
        main(
            [
                "tasks",
                "--env",
                "guess_number",
                "--num-tasks",
                "2",
                "--env-config",
                config,
                "--output",
                str(tmp_path / "t"),
            ]
        )
        == 0
    )
    assert json.loads(load_from_disk(str(tmp_path / "t"))[0]["env_config"])["seed"] == 2**70


def test_rows_built_the_old_way_are_refused_saying_how_to_build_them(tokenizer, tmp_path):
    """Was: ``Dataset.from_list(dict_rows, features=TASK_FEATURES)`` (what earlier docs and scripts did) stores each
    dict's Python repr, which was refused as "not JSON" without saying why or how to build the rows."""
    rows = [
        {"env_class_path": GUESS, "env_config": {"low": 1, "high": 4}, "task_data": {"target": 2}},
        {"env_class_path": GUESS, "env_config": {"low": 1, "high": 4}, "task_data": {"target": 3, "hint": None}},
    ]
    old_way = Dataset.from_list(rows, features=TASK_FEATURES)  # the real datasets call
    assert old_way[1]["task_data"] == "{'target': 3, 'hint': None}"  # a dict's repr: not JSON
    with pytest.raises(TaskValidationError) as caught:
        generate_rollouts(old_way, ScriptedAgent(["2"]), 1, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    message = str(caught.value)
    assert "row 0: field 'env_config'" in message and "Python dict's repr" in message
    assert "hf_rollouts.schema.to_task_dataset(rows)" in message and "json.dumps" in message
    with pytest.raises(TaskValidationError, match=r"row 1: field 'env_config' holds .*Python dict's repr"):
        to_task_dataset([rows[0], old_way[1]])  # a stored row read back and rebuilt
    # built as the message says, the same rows play
    out = generate_rollouts(
        to_task_dataset(rows), ScriptedAgent(["2"]), 1, tokenizer=tokenizer, cache_dir=tmp_path, progress=False
    )
    assert [json.loads(t) for t in out["task_data"]] == [r["task_data"] for r in rows]


@pytest.mark.parametrize(
    "text",
    ["{'a': 1", "not json", "{'a': __import__('os').system('true')}", "{" * 100_000, "['a']", "{1, 2}"],
)
def test_text_that_is_no_python_dict_literal_keeps_the_plain_message(text):
    """Only a Python literal of a dict gets the migration hint; other text, code included, is never evaluated."""
    with pytest.raises(TaskValueError) as caught:
        decode_task_value(text, "row 0: field 'task_data'")
    assert "Python dict's repr" not in str(caught.value) and "row 0: field 'task_data'" in str(caught.value)
