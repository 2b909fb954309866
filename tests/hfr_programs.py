"""Agent programs for tests/test_program_env.py: importable by the programs' own processes (the child gets this
process's import path), named by task rows, so the trust rule applies (allowed_env_modules=["hfr_programs"])."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def client(endpoint):
    import openai  # here, so that the programs that need no client start fast (the timeout test)

    return openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


def tool_loop(endpoint, task):
    """A plain openai loop with tools: run every tool call, send the results, return the last answer's text."""
    c = client(endpoint)
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(4):
        r = c.chat.completions.create(model=endpoint.model, messages=messages, tools=TOOLS, max_tokens=64)
        message = r.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return "no answer"


def chat_loop(endpoint, task):
    """Two plain calls (no tools) that extend each other; returns the answer and a reward of its own."""
    c = client(endpoint)
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(task.get("calls", 2)):
        r = c.chat.completions.create(model=endpoint.model, messages=messages, max_tokens=task.get("max_tokens", 8))
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
    return {"answer": r.choices[0].message.content, "reward": 0.25}


def echo_check(endpoint, task):
    """Asks with its own tag; reward 1 only if every answer it gets names that tag (episodes never mix)."""
    c = client(endpoint)
    messages = [{"role": "user", "content": f"tag {task['tag']}"}]
    ok = True
    for _ in range(3):
        r = c.chat.completions.create(model=endpoint.model, messages=messages)
        text = r.choices[0].message.content
        ok = ok and text == f"tag {task['tag']} seen"
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"tag {task['tag']}"}]
    return 1.0 if ok else 0.0


def rewrite_history(endpoint, task):
    """Two calls; the second drops the first answer and rewrites the question (a compacted history)."""
    c = client(endpoint)
    r = c.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": task["question"]}])
    summary = f"Earlier you said {len(r.choices[0].message.content)} characters. Go on."
    c.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": summary}])
    return 1.0


def streamed(endpoint, task):
    """One streamed call with usage; returns what it read, as JSON text."""
    c = client(endpoint)
    stream = c.chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": task["question"]}], stream=True,
        stream_options={"include_usage": True}, tools=TOOLS,
    )  # fmt: skip
    content, calls, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += [t.function.name for t in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    return {"answer": json.dumps({"content": content, "calls": calls, "finish": finish, "usage": usage}), "reward": 1.0}


def stops(endpoint, task):
    """One call with stop strings and one with max_tokens; returns both answers and finish reasons."""
    c = client(endpoint)
    messages = [{"role": "user", "content": task["question"]}]
    a = c.chat.completions.create(model=endpoint.model, messages=messages, stop=task["stop"])
    messages += [{"role": "assistant", "content": a.choices[0].message.content}, {"role": "user", "content": "more"}]
    b = c.chat.completions.create(model=endpoint.model, messages=messages, max_tokens=task["max_tokens"])
    out = [a.choices[0].message.content, a.choices[0].finish_reason, b.choices[0].message.content]
    return {"answer": json.dumps([*out, b.choices[0].finish_reason, b.usage.completion_tokens]), "reward": 1.0}


def raises(endpoint, task):
    post(
        endpoint,
        "/chat/completions",
        json.dumps({"model": endpoint.model, "messages": [{"role": "user", "content": "hi"}]}).encode(),
    )
    raise ValueError("the program broke on purpose")


def hangs(endpoint, task):
    body = {"model": endpoint.model, "messages": [{"role": "user", "content": "hi"}]}
    assert post(endpoint, "/chat/completions", json.dumps(body).encode())[0] == 200
    with open(task["pid_file"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def never_calls(endpoint, task):
    return 1.0


def post(endpoint, path: str, data: bytes, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        endpoint.base_url + path, data=data, method="POST",
        headers={"Authorization": f"Bearer {key or endpoint.api_key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def bad_requests(endpoint, task):
    """What a real server answers to wrong requests; then one good call. Returns the statuses and codes."""
    import openai

    seen = {}
    try:
        client(endpoint).chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    except openai.NotFoundError as exc:
        seen["unknown_model"] = [exc.status_code, exc.code]
    status, body = post(endpoint, "/chat/completions", b'{"model": "x", "messages": [')
    seen["malformed"] = [status, body["error"]["type"]]
    status, body = post(endpoint, "/chat/completions", json.dumps({"model": endpoint.model, "n": 2,
                        "messages": [{"role": "user", "content": "hi"}]}).encode())  # fmt: skip
    seen["n"] = [status, body["error"]["param"]]
    try:
        client(endpoint).chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "word " * 200}]
        )
    except openai.BadRequestError as exc:
        seen["long"] = [exc.status_code, exc.code]
    status, body = post(endpoint, "/responses", b"{}")
    seen["responses"] = [status, body["error"]["message"]]
    status, body = post(endpoint, "/chat/completions", b"{}", key="hfr-not-a-key")
    seen["bad_key"] = [status, body["error"]["code"]]
    seen["models"] = [m.id for m in client(endpoint).models.list().data]
    r = client(endpoint).chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": "hi"}], temperature=0.3, seed=5
    )
    seen["ok"] = r.choices[0].finish_reason
    return {"answer": json.dumps(seen), "reward": 1.0}


def keeps_key(endpoint, task):
    """Leaves its endpoint behind in a file (a program whose leftovers go on calling after it ended)."""
    with open(task["key_file"], "w") as f:
        json.dump({"base_url": endpoint.base_url, "api_key": endpoint.api_key, "model": endpoint.model}, f)
    client(endpoint).chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "hi"}])
    return 1.0


def sandboxed(endpoint, task):
    """Inside bubblewrap: read a host file, connect to the host's network, then call the endpoint."""
    seen = {}
    try:
        with open(task["secret"]) as f:
            seen["read"] = f.read()
    except OSError as exc:
        seen["read"] = type(exc).__name__
    import socket

    try:
        socket.create_connection((task["host"], task["port"]), timeout=3).close()
        seen["net"] = "connected"
    except OSError as exc:
        seen["net"] = type(exc).__name__
    r = client(endpoint).chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "hi"}])
    seen["call"] = r.choices[0].finish_reason
    return {"answer": json.dumps(seen), "reward": 1.0}


async def async_loop(endpoint, task):
    """An async program with the async client."""
    import openai

    c = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    r = await c.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": task["question"]}])
    return r.choices[0].message.content


def too_long(endpoint, task):
    """A prompt past the model's context, then a short one; returns the error it got."""
    import openai

    try:
        client(endpoint).chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "word " * task["words"]}]
        )
        seen = "answered"
    except openai.BadRequestError as exc:
        seen = f"{exc.status_code} {exc.code}"
    client(endpoint).chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "hi"}])
    return {"answer": seen, "reward": 1.0}


def crashes(endpoint, task):
    """Dies without a word after one call (a segfault would look the same: no result written)."""
    body = {"model": endpoint.model, "messages": [{"role": "user", "content": "hi"}]}
    post(endpoint, "/chat/completions", json.dumps(body).encode())
    print("about to die", flush=True)
    os._exit(3)


def _attempt(action) -> str:
    """``"ok"`` when ``action()`` ran, else the name of what it raised."""
    try:
        action()
        return "ok"
    except OSError as exc:
        return type(exc).__name__


def tampers(endpoint, task):
    """Inside bubblewrap: try to remove the endpoint's socket, plant a file beside it, become root in a user namespace
    of its own (``unshare(CLONE_NEWUSER | CLONE_NEWNS)``, and ``unshare -Urm true``), then call the endpoint."""
    import ctypes
    import errno
    import glob
    import os
    import subprocess

    found = glob.glob("/tmp/hf-rollouts-endpoint-*/endpoint.sock")
    seen = {"uid": os.getuid(), "euid": os.geteuid(), "sockets": len(found)}
    if found:
        sock = found[0]
        seen["unlink"] = _attempt(lambda: os.unlink(sock))
        seen["plant"] = _attempt(lambda: open(os.path.join(os.path.dirname(sock), "planted"), "w").close())
        seen["rename"] = _attempt(lambda: os.rename(sock, sock + ".old"))
    libc = ctypes.CDLL(None, use_errno=True)  # (os.unshare is Python 3.12's)
    seen["unshare"] = "ok" if libc.unshare(0x10000000 | 0x00020000) == 0 else errno.errorcode[ctypes.get_errno()]
    done = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    seen["unshare_cmd"] = done.returncode
    r = client(endpoint).chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "hi"}])
    seen["call"] = r.choices[0].finish_reason
    return {"answer": json.dumps(seen), "reward": 1.0}


def environment(endpoint, task):
    """The names of the environment variables the program's process got (after one call: an episode must make one)."""
    import os

    client(endpoint).chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "hi"}])
    return {"answer": json.dumps(sorted(os.environ)), "reward": 1.0}


def edited_history(endpoint, task):
    """Two calls; the program keeps its own edited copy of each answer in its history (not what the model said);
    reward 1 only when the answers it received are ``task["expected"]``."""
    c = client(endpoint)
    messages, got = [{"role": "user", "content": task["question"]}], []
    for _ in range(2):
        r = c.chat.completions.create(model=endpoint.model, messages=messages)
        got.append(r.choices[0].message.content)
        messages += [
            {"role": "assistant", "content": f"(an answer of {len(got[-1])} characters)"},
            {"role": "user", "content": "more"},
        ]
    return 1.0 if got == task["expected"] else 0.0
