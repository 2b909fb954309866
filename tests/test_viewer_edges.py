"""The viewer's edges (issue 50, item 8), over HTTP against the real server: a card whose YAML uses aliases, infos
nested too deep to parse, too many or too long filters, user columns named like the viewer's own fields, every
loopback name in ``Host`` and an IPv6 server, a tokenizer that ships its own code, and connections that send nothing
or trickle their headers. Each test failed before its fix (the docstrings say how). The browser's side of them:
test_viewer_browser.py."""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from datasets import load_from_disk
from viewer_rollouts import (
    ALIAS_BOMB,
    DEEP_OK,
    TOO_DEEP,
    UNPARSED,
    deep_infos,
    scripted_rollouts,
    shadowing_columns,
    variant,
    with_alias_bomb,
)

from hf_rollouts.viewer import serve, write_html
from hf_rollouts.viewer.api import MAX_FILTER_CHARS, MAX_FILTERS
from hf_rollouts.viewer.card import CardHeaderError, read_card_header
from hf_rollouts.viewer.server import Viewer, ViewerServer, host_allowed, is_loopback
from hf_rollouts.viewer.source import open_rollouts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("viewer_edges")
    return scripted_rollouts(tokenizer, root / "scripted", root / "cache")


def get(url: str, host: str | None = None) -> tuple[int, dict, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.putrequest("GET", parts.path + (f"?{parts.query}" if parts.query else ""), skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def answer(url: str) -> tuple[int, object]:
    status, _, body = get(url)
    return status, json.loads(body)


# -- the card's YAML -----------------------------------------------------------------------------------------------
def test_a_card_whose_yaml_uses_aliases_is_refused_with_a_message(scripted, tmp_path):
    """Was: the alias bomb's tags went into every summary answer, expanded (here 3 MB; three more lines, gigabytes)."""
    folder = with_alias_bomb(scripted, tmp_path / "bomb")
    with serve(folder) as server:
        status, headers, body = get(server.url + "api/summary")
        assert status == 200 and len(body) < 100_000, len(body)
        summary = json.loads(body)
        assert "alias (*a, line 3)" in summary["card"]["error"] and "header" not in summary["card"]
        assert summary["card"]["settings"][0] == ["model", "scripted"]  # the body's provenance is still read


def hub_cache(root: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A Hugging Face Hub cache holding one snapshot of dataset ``repo_id`` with ``files`` (what a download left)."""
    repo = root / f"datasets--{repo_id.replace('/', '--')}"
    commit = "1" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    for name, text in files.items():
        (repo / "snapshots" / commit / name).write_text(text)
    return root


@pytest.mark.parametrize(
    "files, message",
    [
        ({"README.md": "---\n" + ALIAS_BOMB + "---\nbody"}, "the card's YAML header uses an alias"),
        ({"README.md": "---\nlicense: mit\n---\n", ".huggingface.yaml": ALIAS_BOMB}, "its .huggingface.yaml uses"),
    ],
)
def test_a_hub_dataset_whose_card_uses_aliases_is_not_opened(files, message, tmp_path, monkeypatch, capsys):
    """Was: a Hub id went straight to ``load_dataset``, which reads the card's YAML (and ``.huggingface.yaml``) with
    ``yaml.safe_load`` and builds its configs from it. The card comes through the real ``hf_hub_download``, from the
    Hub's cache (offline: the network is the one part not run)."""
    from huggingface_hub import constants

    from hf_rollouts.cli import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache(tmp_path, "someone/bomb", files)))
    with pytest.raises(CardHeaderError, match=f"someone/bomb was not opened: {message}"):
        open_rollouts("someone/bomb")
    assert main(["view", "someone/bomb", "--html", str(tmp_path / "page.html")]) == 2
    assert f"error: someone/bomb was not opened: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "header, message",
    [
        (ALIAS_BOMB, "uses an alias"),
        ("base: &b {x: 1}\nother:\n  <<: *b\n", "uses an alias"),  # a merge key is an alias too
        ("tags: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper than 64"),
        ("tags: " + "[" * 100_000 + "\n", "nested deeper than 64"),
        ("- a\n- b\n", "is a list, not a mapping"),
        ("tags: [unclosed\n", "is not YAML"),
    ],
)
def test_the_card_header_reader_refuses_what_it_should(header, message):
    with pytest.raises(CardHeaderError, match=message):
        read_card_header(f"---\n{header}---\nbody")


def test_the_card_header_reader_reads_a_card_as_written(scripted):
    header = read_card_header((scripted / "README.md").read_text())
    assert isinstance(header, dict) and "hf_rollouts" in header["tags"]
    assert read_card_header("no header") == {} and read_card_header("---\n---\n") == {}
    assert read_card_header("---\nanchor_only: &x 1\n---\n") == {"anchor_only": 1}  # an anchor alone is harmless


# -- infos nested too deep -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deep(scripted, tokenizer, tmp_path_factory):
    return variant(scripted, tokenizer, tmp_path_factory.mktemp("deep") / "deep", deep_infos)


def test_deeply_nested_infos_are_shown_as_text(deep, tmp_path):
    """Was: json.loads raised RecursionError, which no handler caught: the connection dropped with no answer."""
    with serve(deep) as server:
        for row, i, text in [(0, 0, UNPARSED), (0, 1, TOO_DEEP), (1, 0, DEEP_OK)]:
            status, rollout = answer(server.url + f"api/rollout?row={row}&i={i}")
            assert status == 200 and rollout["decision"] == text
        status, group = answer(server.url + "api/group?row=0")
        assert status == 200 and [r["decision"] for r in group["rollouts"]] == [UNPARSED, TOO_DEEP]
        status, rollout = answer(server.url + "api/rollout?row=2&i=0")  # an ordinary infos: still its JSON value
        assert status == 200 and rollout["decision"] == json.loads(load_from_disk(str(deep))[2]["infos"][0])
    write_html(deep, tmp_path / "deep.html")
    assert json.dumps(UNPARSED) in (tmp_path / "deep.html").read_text()  # the one-file page too


def test_an_answer_that_fails_is_a_500_with_its_reason(scripted, monkeypatch):
    """Was: an exception other than ValueError/IndexError/KeyError dropped the connection without an answer."""
    from hf_rollouts.viewer import api

    def broken(*args, **kwargs):
        raise RuntimeError("the group could not be read")

    monkeypatch.setattr(api, "group", broken)
    with serve(scripted) as server:
        status, body = answer(server.url + "api/group?row=0")
        assert status == 500 and body == {"error": "RuntimeError: the group could not be read"}
        assert answer(server.url + "api/info")[0] == 200  # and the server goes on


# -- filters -------------------------------------------------------------------------------------------------------
def test_the_number_and_size_of_filters_are_bounded(scripted):
    """Was: any number of filters of any size was read, each over every task."""
    with serve(scripted) as server:
        base = server.url + "api/tasks?"
        ok = "&".join(["where=length:gt:0"] * MAX_FILTERS)
        assert answer(base + ok)[0] == 200 and answer(base + ok)[1]["total"] == 3
        status, body = answer(base + ok + "&where=length:gt:0")
        assert status == 400 and f"at most {MAX_FILTERS}" in body["error"]
        status, body = answer(base + "where=difficulty:has:" + "x" * MAX_FILTER_CHARS)
        assert status == 400 and f"at most {MAX_FILTER_CHARS}" in body["error"]
        status, body = answer(base + "q=" + "x" * (MAX_FILTER_CHARS + 1))
        assert status == 400 and "search text" in body["error"]
        assert answer(base + "q=" + "x" * MAX_FILTER_CHARS)[0] == 200


# -- user columns named like built-in fields -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def shadowing(scripted, tokenizer, tmp_path_factory):
    return variant(scripted, tokenizer, tmp_path_factory.mktemp("shadow") / "shadow", shadowing_columns)


def test_a_user_column_named_like_a_built_in_field_cannot_replace_it(shadowing, tmp_path):
    """Was: the task table's records took the user's ``rewards``, ``mean_reward``, ``row`` in the built-in's place."""
    ds = load_from_disk(str(shadowing))
    with serve(shadowing) as server:
        status, page = answer(server.url + "api/tasks?sort=row")
        assert status == 200
        assert [r["row"] for r in page["rows"]] == [0, 1, 2]
        finite = [[None if math.isnan(x) else x for x in r] for r in ds["final_rewards"]]
        assert [r["rewards"] for r in page["rows"]] == finite
        assert all(r["mean_reward"] <= 1 for r in page["rows"] if r["mean_reward"] is not None)
        assert [r["env"] for r in page["rows"]] == ["MastermindEnv"] * 3
        assert [r["user.rewards"] for r in page["rows"]] == ["not", "the", "rewards"]
        assert [r["user.row"] for r in page["rows"]] == [7, 8, 9]
        assert {"user.rewards", "user.mean_reward", "user.row", "user.env", "user.text"} <= set(page["columns"])
        assert page["columns"].count("row") == 1 and page["columns"].count("mean_reward") == 1
        status, page = answer(server.url + "api/tasks?where=user.mean_reward:ge:200&sort=user.row&desc=1")
        assert status == 200 and [r["row"] for r in page["rows"]] == [2, 1]
        notes = answer(server.url + "api/summary")[1]["notes"]
        assert "your column 'rewards' is shown as 'user.rewards'" in " ".join(notes)
    write_html(shadowing, tmp_path / "shadow.html")
    data = (tmp_path / "shadow.html").read_text().split('id="hfr-data">', 1)[1].split("</script>", 1)[0]
    records = json.loads(data)["tasks/0"]["rows"]
    assert [r["user.text"] for r in records] == ["mine"] * 3 and all(r["text"] != "mine" for r in records)


# -- the Host check and IPv6 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header, allowed",
    [
        ("127.0.0.1:8000", True),
        ("127.0.0.1", True),
        ("127.1.2.3:8000", True),
        ("localhost:8000", True),
        ("LOCALHOST.", True),
        ("[::1]:8000", True),
        ("[::1]", True),
        ("::1", True),
        ("[::ffff:127.0.0.1]:8000", True),
        ("127.0.0.1:8001", False),
        ("[::1]:8001", False),
        ("attacker.example:8000", False),
        ("127.0.0.1.attacker.example:8000", False),
        ("localhost.attacker.example", False),
        ("[::1", False),
        ("127.0.0.1:80x", False),
        ("10.0.0.1:8000", False),
        ("", False),
    ],
)
def test_the_host_check_takes_every_loopback_name_alike(header, allowed):
    """Was: only ``127.0.0.1:PORT``, ``localhost:PORT`` and ``[::1]:PORT`` exactly (``127.0.0.2`` or no port: 403)."""
    assert host_allowed(header, 8000) is allowed


def test_every_loopback_address_is_served_as_loopback(scripted):
    """Was: a server bound to 127.0.0.2 made no Host check at all (DNS rebinding could read it), and ``::1`` could
    not be bound (an IPv4 socket)."""
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("[::1]") and not is_loopback("0.0.0.0")
    viewer = Viewer(open_rollouts(scripted), background=False)
    for host in ("127.0.0.2", "::1"):
        with ViewerServer(viewer, host).start() as server:
            port = server.port
            bracketed = f"[{host}]" if ":" in host else host
            assert server.url == f"http://{bracketed}:{port}/"
            assert get(server.url + "api/info", host=f"{bracketed}:{port}")[0] == 200
            assert get(server.url + "api/info", host=f"localhost:{port}")[0] == 200
            assert get(server.url + "api/info", host=f"127.0.0.1:{port}")[0] == 200
            assert get(server.url + "api/info", host=f"attacker.example:{port}")[0] == 403


def test_cli_view_serves_ipv6_loopback(scripted):
    """Was: ``hf-rollouts view --host ::1`` failed at bind (``ThreadingHTTPServer`` is IPv4 unless told)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_rollouts.cli", "view", str(scripted), "--host", "::1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\[::1\]:\d+/", line)
        assert url, (line, proc.stderr.read() if proc.poll() is not None else "")
        status, summary = answer(url[0] + "api/summary")
        assert status == 200 and summary["tasks"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "warning" not in proc.stderr.read()  # ::1 is loopback: no warning that the network can read it


# -- a tokenizer that ships its own code ---------------------------------------------------------------------------
EVIL_TOKENIZER = """
import pathlib
pathlib.Path({marker!r}).write_text("the dataset's tokenizer code ran")
from transformers import PreTrainedTokenizerFast


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def test_a_tokenizer_in_the_dataset_folder_runs_no_code(scripted, tokenizer, tmp_path):
    """Was: ``AutoTokenizer.from_pretrained`` without ``trust_remote_code``: in a terminal it asked "Do you wish to run
    the custom code? [y/N]", and a ``y`` (here on stdin) ran the code the dataset folder ships."""
    folder = variant(scripted, tokenizer, tmp_path / "evil", lambda ds: ds)
    marker = tmp_path / "ran"
    config_file = folder / "tokenizer" / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil_tok.EvilTokenizer", None]})
    config_file.write_text(json.dumps(config))
    (folder / "tokenizer" / "evil_tok.py").write_text(EVIL_TOKENIZER.format(marker=str(marker)))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    page = tmp_path / "page.html"
    done = subprocess.run(
        [sys.executable, "-m", "hf_rollouts.cli", "view", str(folder), "--html", str(page)],
        input="y\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert not marker.exists(), "the dataset's tokenizer code ran"
    assert done.returncode == 0, done.stderr
    assert "was not loaded (tokens show by id)" in done.stdout and "trust_remote_code=False" in done.stdout
    assert page.is_file()
    named = subprocess.run(
        [sys.executable, "-m", "hf_rollouts.cli", "view", str(scripted), "--tokenizer", str(folder / "tokenizer")],
        input="y\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert named.returncode == 2 and "contains custom code" in named.stderr and not marker.exists()


# -- idle connections ----------------------------------------------------------------------------------------------
def closed_by_server(sock: socket.socket, within: float, trickle: bytes | None = None) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (sending ``trickle`` every 0.2 s meanwhile)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            try:
                return sock.recv(65536) == b""  # closed without an answer
            except ConnectionResetError:
                return True
        if trickle is not None:
            try:
                sock.sendall(trickle)
            except (BrokenPipeError, ConnectionResetError):
                return True
    return False


def test_idle_and_trickling_connections_are_closed(scripted):
    """Was: a connection that sent nothing, or one header byte at a time, held its thread open for ever. The bound
    checked is 30 times the server's timeout (a shared machine), never a speed."""
    viewer = Viewer(open_rollouts(scripted), background=False)
    with ViewerServer(viewer, timeout=1.0).start() as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        trickling = socket.create_connection(("127.0.0.1", server.port))
        try:
            trickling.sendall(b"GET /api/summary HTTP/1.1\r\n")
            assert closed_by_server(trickling, 30, trickle=b"X-Slow: 1\r\n")  # each line within the socket timeout
            assert closed_by_server(silent, 30)
        finally:
            silent.close()
            trickling.close()
        status, info = answer(server.url + "api/info")  # ordinary requests still answered
        assert status == 200 and info["datasets"] == [str(scripted)]
        slow_but_whole = socket.create_connection(("127.0.0.1", server.port))
        try:  # a whole request sent in parts well within the timeout is answered
            slow_but_whole.sendall(b"GET /api/info HTTP/1.1\r\n")
            slow_but_whole.sendall(f"Host: 127.0.0.1:{server.port}\r\n\r\n".encode())
            slow_but_whole.settimeout(30)
            assert slow_but_whole.recv(12) == b"HTTP/1.0 200"
        finally:
            slow_but_whole.close()
