"""A loopback stand-in for a hosted chat API (the shape of OpenAI's ``/v1/chat/completions``): chat only.

It has no ``/v1/completions``, no ``/tokenize`` and no tokenizer: every other path is a 404, and a request field the
hosted API does not know (``return_token_ids``, ``top_k``, ``min_p``, ...) is a 400 naming it, as OpenAI answers
("Unrecognized request argument supplied: top_k"). Answers carry text only (no token ids, no log-probs). What it
says is ``reply(messages) -> str``: a test's judge behind the network boundary. Every request is logged in
``server.log`` as ``(method, path, body)``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KNOWN_FIELDS = {  # OpenAI's chat completion request fields (those a client of this project may send)
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "logprobs",
    "top_logprobs",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "stream",
    "user",
    "logit_bias",
}


class ChatOnlyServer:
    """``POST /v1/chat/completions`` on 127.0.0.1 answered by ``reply``; ``model`` must be ``served_model_name``."""

    def __init__(self, reply: Callable[[list[dict[str, str]]], str], served_model_name: str = "judge-1") -> None:
        self.reply, self.model, self.log = reply, served_model_name, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                server.log.append(("GET", self.path, None))
                self._send(404, _error(f"Invalid URL (GET {self.path})", None))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                server.log.append(("POST", self.path, body))
                if self.path != "/v1/chat/completions":
                    self._send(404, _error(f"Invalid URL (POST {self.path})", None))
                    return
                unknown = sorted(set(body) - KNOWN_FIELDS)
                if unknown:
                    self._send(400, _error(f"Unrecognized request argument supplied: {unknown[0]}", None))
                    return
                if body.get("model") != server.model:
                    self._send(404, _error(f"The model `{body.get('model')}` does not exist.", "model"))
                    return
                text = server.reply(body["messages"])
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(server.log)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": server.model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "logprobs": None,
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ChatOnlyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self) -> set[str]:
        """Every path a request was sent to."""
        return {path for _, path, _ in self.log}


def _error(message: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
