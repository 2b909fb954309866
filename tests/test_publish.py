"""Hub push, tested at the network boundary: the Hub clients' upload calls are replaced by recorders."""

from __future__ import annotations

import json

from datasets import Dataset
from huggingface_hub import DatasetCard, HfApi

from hf_rollouts.cli import main
from hf_rollouts.publish import push_rollouts


def record_pushes(monkeypatch):
    calls = []

    def data_push(self, repo_id, **kwargs):
        calls.append(("data", repo_id, kwargs, len(self), list(self.column_names)))

    def card_push(self, repo_id, **kwargs):
        calls.append(("card", repo_id, kwargs, str(self)))

    def file_upload(self, **kwargs):
        calls.append(("file", kwargs["repo_id"], kwargs, kwargs["path_in_repo"], kwargs["path_or_fileobj"]))

    monkeypatch.setattr(Dataset, "push_to_hub", data_push)
    monkeypatch.setattr(DatasetCard, "push_to_hub", card_push)
    monkeypatch.setattr(HfApi, "upload_file", file_upload)
    return calls


def test_push_sends_data_then_card(monkeypatch):
    calls = record_pushes(monkeypatch)
    ds = Dataset.from_dict({"x": [1, 2]})
    card = DatasetCard("---\nlicense: apache-2.0\n---\n# body")
    url = push_rollouts(ds, "me/rollouts", card, private=True, token="t")
    assert url == "https://huggingface.co/datasets/me/rollouts"
    assert [c[0] for c in calls] == [
        "data",
        "file",
        "card",
    ]  # the card body must come last, or push_to_hub's README rewrite wins
    assert calls[0][2]["private"] is True and calls[0][2]["token"] == "t"
    assert calls[1][3] == "provenance.json" and calls[1][2]["repo_type"] == "dataset"
    provenance = json.loads(calls[1][4])
    assert provenance["run"] is None and len(provenance["data"]["row_hashes"]) == 2  # not made by generate_rollouts
    assert calls[2][2]["repo_type"] == "dataset" and "# body" in calls[2][3]
    assert "hf_rollouts_provenance:" in calls[2][3]  # the card carries the block (without the per-row hashes)


def test_cli_generate_pushes_with_the_card(monkeypatch, tmp_path, capsys):
    calls = record_pushes(monkeypatch)
    rc = main(
        [
            "generate",
            "--env",
            "guess_number",
            "--num-tasks",
            "2",
            "--num-rollouts",
            "2",
            "--max-new-tokens",
            "4",
            "--output",
            str(tmp_path / "out"),
            "--cache-dir",
            str(tmp_path / "c"),
            "--push-to-hub",
            "me/gn",
            "--private",
        ]
    )
    assert rc == 0 and "pushed to https://huggingface.co/datasets/me/gn" in capsys.readouterr().out
    (data, repo, kwargs, rows, columns), card = calls[0], calls[2]
    assert json.loads(calls[1][4])["run"]["agent"]["spec"] == "tiny"
    assert (data, repo, rows, kwargs["private"]) == ("data", "me/gn", 2, True) and "padded_full_token_ids" in columns
    assert card[0] == "card" and 'load_dataset("me/gn"' in card[3] and "GuessNumberEnv" in card[3]


def test_float16_logprobs_halve_precision_not_structure(tokenizer, tmp_path):
    import math
    import os

    from datasets import load_dataset, load_from_disk

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.publish import parquet_files, save_rollouts
    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model()
    ds = generate_rollouts(
        MastermindEnv(tok, {"max_turns": 2}).get_train_dataset(2),
        TransformersAgent(model, tok, max_new_tokens=6),
        2,
        cache_dir=tmp_path / "c",
        progress=False,
    )
    exact = save_rollouts(ds, tmp_path / "exact")
    half = save_rollouts(ds, tmp_path / "half", logprob_dtype="float16")
    assert load_from_disk(str(exact))["padded_logprobs"] == ds["padded_logprobs"]
    small = load_dataset("parquet", data_files=parquet_files(half), split="train")
    assert small["padded_full_token_ids"] == ds["padded_full_token_ids"]
    for a, b in zip(small["padded_logprobs"], ds["padded_logprobs"]):
        for x, y in zip(sum(a, []), sum(b, [])):
            assert math.isclose(x, y, rel_tol=2e-3, abs_tol=1e-6)
    size = lambda out: sum(os.path.getsize(f) for f in parquet_files(out))  # noqa: E731
    assert size(half) < size(exact)
