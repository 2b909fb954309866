"""The viewer's data and server without a browser: answers checked against the dataset, the places a dataset is
opened from, what the server refuses, the one-file export and the CLI command (the browser: test_viewer_browser.py)."""

from __future__ import annotations

import http.client
import json
import math
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from datasets import Dataset, Features, Json, load_from_disk
from viewer_rollouts import HOSTILE, model_rollouts, scripted_rollouts

import hf_rollouts
from hf_rollouts.cli import main
from hf_rollouts.publish import compute_stats
from hf_rollouts.training import group_advantages
from hf_rollouts.viewer import serve, write_html
from hf_rollouts.viewer.server import MAX_HTML_TASKS, Viewer, render_html
from hf_rollouts.viewer.source import open_rollouts, task_keys

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("viewer")
    return scripted_rollouts(tokenizer, root / "scripted", root / "cache")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, tiny):
    from hf_rollouts.agents.hf import TransformersAgent

    root = tmp_path_factory.mktemp("viewer_model")
    agent = TransformersAgent(tiny[0], tiny[1], temperature=1.0, max_new_tokens=10, seed=0)
    return model_rollouts(agent, root / "tiny", root / "cache")


def get(url: str, host: str | None = None) -> tuple[int, dict, bytes]:
    parts = urllib.request.urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.putrequest("GET", parts.path + (f"?{parts.query}" if parts.query else ""), skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_answers_match_the_dataset(sampled):
    ds = load_from_disk(str(sampled))
    viewer = Viewer(open_rollouts(sampled), background=False)
    summary = viewer.answer("/api/summary", {})
    statuses = [s for row in ds["statuses"] for s in row]
    assert (summary["tasks"], summary["rollouts"], summary["k"]) == (3, 6, 2)
    assert summary["statuses"] == {s: statuses.count(s) for s in set(statuses)}
    assert summary["stats"] == [list(r) for r in compute_stats(ds).table()]  # the card's own table
    assert sum(summary["histogram"]["counts"]) == sum(1 for r in ds["final_rewards"] for x in r if math.isfinite(x))
    assert summary["card"]["settings"][0] == ["model", "tiny"] and summary["tokenizer"]
    assert summary["sampling"] and summary["sampling"][0]["rollouts"] == 6
    lo, hi = summary["pass_at_k_interval"]
    assert 0 <= lo <= summary["pass_at_k"] <= hi <= 1
    for row in range(len(ds)):
        group = viewer.answer("/api/group", {"row": [str(row)]})
        want = group_advantages(ds[row]["final_rewards"], ds[row]["statuses"], "grpo")
        assert [r["advantage"] for r in group["rollouts"]] == [None if math.isnan(a) else a for a in want]
        assert [r["status"] for r in group["rollouts"]] == ds[row]["statuses"]
    item, tok = ds[1], open_rollouts(sampled).tokenizer
    rollout = viewer.answer("/api/rollout", {"row": ["1"], "i": ["1"]})
    tokens = [t for segment in rollout["segments"] for t in segment["tokens"]]
    real = sum(item["padded_full_attention_mask"][1])
    assert [t["id"] for t in tokens] == item["padded_full_token_ids"][1][:real]
    assert [t["text"] for t in tokens] == [tok.decode([t["id"]]) for t in tokens]
    agent = [t for s in rollout["segments"] if s["kind"] == "agent" for t in s["tokens"]]
    assert len(agent) == sum(item["padded_agent_token_mask"][1]) > 0
    assert [t["logprob"] for t in agent] == [item["padded_logprobs"][1][t["position"]] for t in agent]
    assert rollout["messages"] == item["conversations"][1]


def test_the_task_table_sorts_filters_searches_and_pages(scripted):
    ds = load_from_disk(str(scripted))
    viewer = Viewer(open_rollouts(scripted), background=False)

    def rows(**params):
        page = viewer.answer("/api/tasks", {k: v if isinstance(v, list) else [str(v)] for k, v in params.items()})
        return page["total"], [r["row"] for r in page["rows"]]

    means = [
        sum(x for x in r if math.isfinite(x)) / max(1, sum(math.isfinite(x) for x in r)) for r in ds["final_rewards"]
    ]
    assert rows(sort="mean_reward", desc=1)[1][0] == max(range(3), key=means.__getitem__)
    assert rows(status="error") == (1, [i for i, s in enumerate(ds["statuses"]) if "error" in s])
    hard = [i for i, d in enumerate(ds["difficulty"]) if d == "hard"]
    assert rows(where=["difficulty:eq:hard"]) == (len(hard), hard)  # a column the user's dataset kept
    assert rows(where=["difficulty:eq:hard", "length:gt:0"], sort="difficulty") == (len(hard), hard)
    assert rows(q="WINDOW.pwned")[0] == sum(
        any(HOSTILE in (m["content"] or "") for r in c for m in r) for c in ds["conversations"]
    )
    assert rows(q="no such text anywhere") == (0, [])
    assert rows(limit=2) == (3, [0, 1]) and rows(limit=2, offset=2) == (3, [2])
    with pytest.raises(ValueError, match="column:op:value"):
        rows(where=["nonsense:eq:1"])


def test_the_server_serves_its_addresses_only_on_loopback(scripted):
    server = serve(scripted)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.httpd.server_address[0] == "127.0.0.1"
        status, headers, body = get(server.url)
        assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
        assert not re.search(r"(src|href)=\"(https?:)?//", body.decode())  # nothing from the network
        for path in ("../pyproject.toml", "%2e%2e/%2e%2e/etc/passwd", "app.js/../../../etc/passwd", "static/app.js",
                     "api/../../../etc/passwd", "..%2f..%2fpyproject.toml", "state.json", "README.md"):  # fmt: skip
            assert get(server.url + path)[0] == 404, path
        assert get(server.url + "api/group?row=99")[0] == 400
        assert get(server.url + "api/rollout?row=0")[0] == 404  # no rollout index given
        assert get(server.url, host="attacker.example:80")[0] == 403  # DNS rebinding: another site's name
        status, _, body = get(server.url + "api/info")
        assert status == 200 and json.loads(body)["datasets"] == [str(scripted)]
    finally:
        server.close()
    url = hf_rollouts.view(load_from_disk(str(scripted)))  # from Python (a notebook): the address, served
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url) and json.loads(get(url + "api/summary")[2])["tasks"] == 3


def test_opens_parquet_cache_folders_and_datasets_in_memory(scripted, tokenizer, tmp_path):
    ds = load_from_disk(str(scripted))
    parquet = scripted / "parquet" / "train-00000-of-00001.parquet"
    scripted_rollouts(tokenizer, tmp_path / "again", tmp_path / "cache")  # its shard files: a cache folder
    for source in (parquet, scripted / "parquet", tmp_path / "cache", ds, ds.select([2, 0, 1])):
        opened = open_rollouts(source)
        assert opened.dataset.num_rows == 3
        viewer = Viewer(opened, background=False)
        assert viewer.answer("/api/summary", {})["rollouts"] == 6
    assert open_rollouts(parquet).tokenizer is not None and open_rollouts(parquet).card  # found beside the data
    assert "1 complete run(s)" in open_rollouts(tmp_path / "cache").notes[0]
    shuffled = Viewer(open_rollouts(ds.select([2, 0, 1])), background=False)
    assert shuffled.answer("/api/group", {"row": ["1"]})["task"] == {
        c: ds[0][c] for c in ("env_class_path", "env_config", "task_data")
    }
    with pytest.raises(FileNotFoundError):
        open_rollouts(tmp_path / "nothing-here")


def test_compare_keys_match_a_task_whatever_wrote_its_json():
    """Today's exact JSON text and an earlier version's ``Json()`` column (ASCII escapes, its own spacing and key
    order) of the same task give one key, so a run saved before the storage change compares with one saved after."""
    task = {"word": "café", "n": 3}
    today = Dataset.from_dict({"env_class_path": ["e.E"], "env_config": ["{}"], "task_data": [json.dumps(task)]})
    earlier = Dataset.from_list(
        [{"env_class_path": "e.E", "env_config": {}, "task_data": {"n": 3, "word": "café"}}],
        features=Features(
            {"env_class_path": today.features["env_class_path"], "env_config": Json(), "task_data": Json()}
        ),
    )
    other = Dataset.from_dict(
        {"env_class_path": ["e.E"], "env_config": ["{}"], "task_data": ['{"word": "cafe", "n": 3}']}
    )
    assert task_keys(today) == task_keys(earlier) != task_keys(other)


def test_compare_matches_tasks_in_any_order(scripted, tokenizer, tmp_path):
    after = load_from_disk(str(scripted)).select([2, 1, 0])
    before = scripted_rollouts(tokenizer, tmp_path / "before", tmp_path / "cache", solve_first=False)
    viewer = Viewer(open_rollouts(before), open_rollouts(after), background=False)
    page = viewer.answer("/api/compare", {"sort": ["delta"], "desc": ["1"]})
    assert (page["matched"], page["only_a"], page["only_b"]) == (3, 0, 0)
    top = page["rows"][0]
    assert (top["row_a"], top["row_b"], top["before"], top["after"], top["delta"]) == (0, 2, 0.0, 1.0, 1.0)
    assert page["improved"] == 1 and page["mean_delta"] == pytest.approx(1 / 3)


def test_the_html_page_holds_everything_and_no_live_markup(scripted, tmp_path):
    url = write_html(scripted, tmp_path / "view.html")
    page = (tmp_path / "view.html").read_text()
    assert url.startswith("file://") and "<script src" not in page and '<link rel="stylesheet"' not in page
    data = page.split('<script type="application/json" id="hfr-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and "window.PWNED" in data  # the hostile reply is in it, unable to close the tag
    answers = json.loads(data)
    assert {"info", "summary/0", "tasks/0", "group/0/2", "rollout/0/2/1"} <= set(answers)
    assert page.count("<script") == 2 and "sha256-" in page
    viewer = Viewer(open_rollouts(load_from_disk(str(scripted)).select([0] * (MAX_HTML_TASKS + 1))), background=False)
    with pytest.raises(ValueError, match="at most 500"):
        render_html(viewer)


def test_cli_view_serves_and_prints_the_address(scripted, tmp_path, capsys):
    assert main(["view", str(scripted), "--html", str(tmp_path / "v.html")]) == 0
    assert (tmp_path / "v.html").is_file() and "wrote" in capsys.readouterr().out
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_rollouts.cli", "view", str(scripted)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)[0]
        with urllib.request.urlopen(url + "api/summary") as response:
            assert json.loads(response.read())["tasks"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_without_a_browser_the_reason_says_what_to_install(monkeypatch):
    from hf_rollouts.viewer import browser

    monkeypatch.delenv("HF_ROLLOUTS_CHROMIUM", raising=False)
    monkeypatch.delenv("HF_ROLLOUTS_CHROMEDRIVER", raising=False)
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    reason = browser.missing()
    assert reason.startswith("no chromium, chromedriver") and "apt-get install -y chromium chromium-driver" in reason
    with pytest.raises(RuntimeError, match="no chromium"):
        browser.start_browser()
