"""A loopback server that speaks vLLM's OpenAI protocol and samples with a transformers model on CPU.

Request and response shapes, and the sampling, follow these files of vLLM's source (GitHub
``vllm-project/vllm``, at the commits given where they were read):

* ``vllm/entrypoints/openai/completion/protocol.py`` @002032ee2b18 — ``CompletionRequest``
  (``prompt: list[int] | str``, ``logprobs: int``, ``return_token_ids``, ``stop_token_ids``,
  ``seed``, ``top_k``/``min_p``/``repetition_penalty``/``presence_penalty``/``frequency_penalty``,
  extra fields allowed and ignored); ``CompletionRequest.to_sampling_params``: a field the request
  leaves unset (``None``) takes the server's default, else OpenAI's (``_DEFAULT_SAMPLING_PARAMS``:
  temperature 1, top_p 1, top_k 0 = off, min_p 0, penalties neutral);
  ``CompletionResponse``/``CompletionResponseChoice``
  (``text``, ``logprobs{text_offset,token_logprobs,tokens,top_logprobs}``, ``finish_reason``,
  ``stop_reason``, ``token_ids``, ``prompt_token_ids``, ``prompt_logprobs``; ``logit_bias`` is applied
  as a logits processor, so raw log-probs include it here);
* ``vllm/entrypoints/openai/chat_completion/protocol.py`` @002032ee2b18 — ``ChatCompletionResponse``
  (``prompt_token_ids`` on the response; ``token_ids``/``stop_reason`` on the choice;
  ``logprobs.content[*]{token,logprob,bytes,top_logprobs}``);
* ``vllm/entrypoints/openai/engine/protocol.py`` @040a2cc2a629 — ``ErrorResponse``
  ``{"error": {"message", "type", "param", "code"}}``;
* ``vllm/config/model.py`` @18ec66292536 ``ModelConfig.get_diff_sampling_param`` — the server's
  defaults: with ``--generation-config auto`` (the default) the served model's
  ``generation_config.json`` values of ``repetition_penalty``, ``temperature``, ``top_k``, ``top_p``,
  ``min_p`` and ``max_new_tokens`` (as ``max_tokens``). Here: ``generation_config=`` or, by default,
  the model's ``generation_config`` (loaded from ``generation_config.json`` in ``main``);
* ``vllm/v1/core/sched/utils.py`` @018d5dc78efa ``check_stop`` — the EOS/stop id is the last
  sampled id (kept in ``token_ids`` and log-probs, cut from ``text``); ``stop_reason`` is the id
  for a ``stop_token_ids`` hit and ``null`` for EOS;
* ``vllm/v1/engine/detokenizer.py`` @e372329d90d7 ``BaseIncrementalDetokenizer.update`` and
  ``vllm/engine/output_processor/stop_checker.py`` ``check_stop_strings``, with
  ``vllm/v1/engine/output_processor.py`` @d07822605346 ``process_outputs`` — stop strings: after each
  sampled token the output text is checked; the first stop string found ends the request
  (``finish_reason`` "stop", ``stop_reason`` the string); the *text* is cut before the stop string, or
  after it with ``include_stop_str_in_output``; ``token_ids`` and log-probs keep every sampled id,
  the one that completed the stop string included;
* ``vllm/v1/sample/sampler.py`` ``Sampler.forward``/``sample`` and
  ``vllm/v1/sample/ops/topk_topp_sampler.py`` ``TopKTopPSampler.forward_native`` — the order:
  raw log-probs, then penalties (repetition on prompt and output ids, frequency and presence on
  output ids), temperature, min-p, top-k and top-p, sampling; ``--logprobs-mode``:
  ``raw_logprobs`` (default, ``log_softmax(logits)`` before all of it) or ``processed_logprobs``
  (``log_softmax`` after top-k/top-p, renormalised over the kept tokens; -inf clamped to -9999.0).

Sampling is a plain loop (KV cache, ``torch.Generator`` seeded with the request's ``seed``).
Every request is logged in ``server.log`` (endpoint, body, the sampling parameters in effect,
prompt ids, sampled ids, log-probs), so tests can compare what the server did with what
hf_rollouts stored.

Run by hand: ``python tests/vllm_protocol_server.py --model DIR --port 8011 [--logprobs-mode processed_logprobs]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

MAX_MODEL_LEN = 4096
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
OPENAI_DEFAULTS = {  # CompletionRequest._DEFAULT_SAMPLING_PARAMS, and max_tokens' field default
    "max_tokens": 16,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
GENERATION_CONFIG_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def server_defaults(generation_config: Any) -> dict[str, Any]:
    """vLLM's ``get_diff_sampling_param`` for ``--generation-config auto``: the config's non-default sampling values."""
    if generation_config is None:
        return {}
    diff = generation_config.to_diff_dict()
    found = {k: diff[k] for k in GENERATION_CONFIG_FIELDS if diff.get(k) is not None}
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    return found


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: int = 400) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class VLLMProtocolServer:
    """``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` and ``/health`` on 127.0.0.1.

    Args:
        model, tokenizer: the transformers model and its tokenizer (its chat template renders chats).
        served_model_name: the ``model`` requests must name (404 otherwise, as vLLM).
        logprobs_mode: vLLM's ``--logprobs-mode`` (``raw_logprobs`` or ``processed_logprobs``).
        return_token_ids_supported: ``False`` imitates a vLLM older than ``return_token_ids``
            (the field is accepted and ignored: a 200 without ids).
        generation_config: a ``transformers.GenerationConfig`` whose sampling values fill the fields
            a request leaves unset (vLLM's ``--generation-config auto``); default the model's own.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        served_model_name: str = "tiny",
        logprobs_mode: str = "processed_logprobs",
        return_token_ids_supported: bool = True,
        generation_config: Any = None,
        port: int = 0,
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.name, self.logprobs_mode = served_model_name, logprobs_mode
        self.return_token_ids_supported = return_token_ids_supported
        config = generation_config if generation_config is not None else getattr(model, "generation_config", None)
        self.defaults = server_defaults(config)
        self.log: list[dict[str, Any]] = []
        self.ignored_fields: list[str] = []
        self._model_lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})
                else:
                    self._send(404, _error(f"Not Found: {self.path}", "NotFoundError", None, 404))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    route = {"/v1/completions": server.completions, "/v1/chat/completions": server.chat}.get(self.path)
                    if route is None:
                        raise BadRequest(f"Not Found: {self.path}", None, 404)
                    self._send(200, route(body))
                except BadRequest as exc:
                    kind = "NotFoundError" if exc.code == 404 else "BadRequestError"
                    self._send(exc.code, _error(str(exc), kind, exc.param, exc.code))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> VLLMProtocolServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    # -- protocol ------------------------------------------------------------------
    def _common(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") not in (None, self.name):
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", "model", 404)
        known = {
            "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
            "logprobs", "top_logprobs", "return_token_ids", "stop_token_ids", "n", "stream", "logit_bias",
            "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
            "include_stop_str_in_output",
        }  # fmt: skip
        self.ignored_fields += [k for k in body if k not in known]  # vLLM: extra="allow", a warning only
        if body.get("n", 1) != 1 or body.get("stream"):
            raise BadRequest("this test server serves n=1, non-streaming requests only")
        stop = body.get("stop_token_ids") or []
        if not (isinstance(stop, list) and all(isinstance(i, int) for i in stop)):
            raise BadRequest("stop_token_ids must be a list of ints", "stop_token_ids")
        stop_strings = body.get("stop") or []
        stop_strings = [stop_strings] if isinstance(stop_strings, str) else stop_strings
        if not (isinstance(stop_strings, list) and all(isinstance(x, str) for x in stop_strings)):
            raise BadRequest("stop must be a string or a list of strings", "stop")
        sent = {**body, "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens")}
        # to_sampling_params: the request's value, else the server's default, else OpenAI's
        p = {k: sent[k] if sent.get(k) is not None else self.defaults.get(k, d) for k, d in OPENAI_DEFAULTS.items()}
        if not (p["top_k"] >= -1 and 0 <= p["min_p"] <= 1 and p["repetition_penalty"] > 0):  # SamplingParams
            raise BadRequest(
                f"invalid sampling parameters: top_k={p['top_k']} (>= -1), min_p={p['min_p']} (in [0, 1]), "
                f"repetition_penalty={p['repetition_penalty']} (> 0)"
            )
        return {
            **{k: float(v) for k, v in p.items() if k not in ("max_tokens", "top_k")},
            "max_tokens": int(p["max_tokens"]),
            "top_k": int(p["top_k"]),
            "seed": body.get("seed"),
            "stop_token_ids": stop,
            "stop": stop_strings,
            "include_stop": bool(body.get("include_stop_str_in_output")),
            "return_ids": bool(body.get("return_token_ids")) and self.return_token_ids_supported,
            "logit_bias": {int(k): float(v) for k, v in (body.get("logit_bias") or {}).items()},
        }

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        params = self._common(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            prompt_ids = self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) and i >= 0 for i in prompt):
            prompt_ids = list(prompt)
        else:
            raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or (logprobs < 0 and logprobs != -1)):
            raise BadRequest("`logprobs` must be a positive value or -1.", "logprobs")
        ids, lps, finish, stop_reason = self._generate(prompt_ids, params)
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        choice = {
            "index": 0,
            "text": self._text(ids, finish, stop_reason, params),
            "logprobs": None
            if logprobs is None
            else {
                "text_offset": [0] * len(ids),
                "token_logprobs": lps,
                "tokens": tokens,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps)],
            },
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": ids if params["return_ids"] else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if params["return_ids"] else None,
            "routed_experts": None,
        }
        self._record("completions", body, params, prompt_ids, ids, lps)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(prompt_ids, ids),
            "kv_transfer_params": None,
        }

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        params = self._common(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", "messages")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]  # chat: add_special_tokens=False
        ids, lps, finish, stop_reason = self._generate(prompt_ids, params)
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": self._text(ids, finish, stop_reason, params),
                "reasoning": None,
                "tool_calls": [],
            },
            "logprobs": {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in zip(tokens, lps)
                ]
            }
            if body.get("logprobs")
            else None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": ids if params["return_ids"] else None,
        }
        self._record("chat", body, params, prompt_ids, ids, lps)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "usage": _usage(prompt_ids, ids),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if params["return_ids"] else None,
            "kv_transfer_params": None,
        }

    # -- sampling ------------------------------------------------------------------
    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], p: dict[str, Any]) -> tuple[list[int], list[float], str, Any]:
        if len(prompt_ids) + p["max_tokens"] > MAX_MODEL_LEN:
            raise BadRequest(
                f"You passed {len(prompt_ids)} input tokens and requested {p['max_tokens']} output tokens. However, "
                f"the model's context length is only {MAX_MODEL_LEN} tokens.",
                "input_tokens",
            )
        eos = self.tokenizer.eos_token_id
        gen = torch.Generator().manual_seed(int(p["seed"]) if p["seed"] is not None else 0)
        ids: list[int] = []
        lps: list[float] = []
        with self._model_lock:
            device = self.model.device  # the model may sit on CUDA; sampling runs on the CPU (a CPU generator)
            past, step = None, torch.tensor([prompt_ids], device=device)
            key = "cache" if "cache" in inspect.signature(type(self.model).forward).parameters else "past_key_values"
            for _ in range(p["max_tokens"]):
                out = self.model(input_ids=step, **{key: past}, use_cache=True)
                past, logits = getattr(out, key), out.logits[0, -1].float().cpu()
                for token_id, bias in p["logit_bias"].items():  # OpenAI's logit_bias, a logits processor
                    logits[token_id] += bias
                raw = torch.log_softmax(logits, -1)
                logits = _penalized(logits, prompt_ids, ids, p)
                if p["temperature"] == 0:
                    token, processed = int(torch.argmax(logits)), torch.log_softmax(logits, -1)
                else:
                    processed = torch.log_softmax(_truncated(logits / p["temperature"], p), -1)
                    token = int(torch.multinomial(processed.exp(), 1, generator=gen))
                chosen = (processed if self.logprobs_mode == "processed_logprobs" else raw)[token]
                ids.append(token)
                lps.append(max(float(chosen), -9999.0))
                step = torch.tensor([[token]], device=device)
                if token == eos:
                    return ids, lps, "stop", None
                if token in p["stop_token_ids"]:
                    return ids, lps, "stop", token
                if p["stop"]:  # the detokenizer's check after each token: every sampled id is kept
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    found = [x for x in p["stop"] if x in text]
                    if found:
                        return ids, lps, "stop", min(found, key=text.index)
        return ids, lps, "length", None

    def _text(self, ids: list[int], finish: str, stop_reason: Any, p: dict[str, Any]) -> str:
        if isinstance(stop_reason, str):  # a stop string: the text is cut at it (after it with the include flag)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            at = text.index(stop_reason)
            return text[: at + len(stop_reason)] if p["include_stop"] else text[:at]
        shown = ids[:-1] if finish == "stop" else ids  # the detokenizer drops the stop token from the text
        return self.tokenizer.decode(shown, skip_special_tokens=True)

    def _record(self, endpoint: str, body: dict, params: dict, prompt_ids: list, ids: list, lps: list) -> None:
        self.log.append(
            {
                "endpoint": endpoint,
                "body": body,
                "params": {k: params[k] for k in OPENAI_DEFAULTS},  # the sampling parameters in effect
                "prompt_ids": list(prompt_ids),
                "token_ids": ids,
                "logprobs": lps,
            }
        )


def _penalized(logits: torch.Tensor, prompt_ids: list[int], ids: list[int], p: dict[str, Any]) -> torch.Tensor:
    """vLLM's ``apply_penalties``: repetition on prompt and output ids, frequency and presence on output ids."""
    logits = logits.clone()
    if p["repetition_penalty"] != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(ids)))
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p["repetition_penalty"], values * p["repetition_penalty"])
    if ids and (p["frequency_penalty"] or p["presence_penalty"]):
        counts = torch.bincount(torch.tensor(ids), minlength=logits.numel()).float()
        logits -= p["frequency_penalty"] * counts + p["presence_penalty"] * (counts > 0).float()
    return logits


def _truncated(scaled: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """min-p, then top-k, then top-p on temperature-scaled logits (removed tokens at -inf)."""
    scaled = scaled.clone()
    probs = torch.softmax(scaled, -1)
    if p["min_p"] > 0:
        scaled[probs < p["min_p"] * probs.max()] = float("-inf")
    if p["top_k"] > 0:
        scaled[scaled < torch.topk(scaled, min(p["top_k"], scaled.numel())).values[-1]] = float("-inf")
    if p["top_p"] < 1.0:
        probs = torch.softmax(scaled, -1)
        order = torch.argsort(probs, descending=True)
        outside = torch.cumsum(probs[order], -1) - probs[order] >= p["top_p"]
        scaled[order[outside]] = float("-inf")
    return scaled


def _usage(prompt_ids: list[int], ids: list[int]) -> dict[str, Any]:
    n, m = len(prompt_ids), len(ids)
    return {"prompt_tokens": n, "total_tokens": n + m, "completion_tokens": m, "prompt_tokens_details": None}


def _error(message: str, kind: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    parser = argparse.ArgumentParser(description="vLLM-protocol test server (transformers on CPU, loopback only)")
    parser.add_argument("--model", required=True, help="local model directory")
    parser.add_argument("--served-model-name", default="tiny")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--logprobs-mode", default="raw_logprobs", choices=LOGPROBS_MODES)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = None  # vLLM's --generation-config auto: the model directory's generation_config.json, if any
    if (Path(args.model) / "generation_config.json").is_file():
        config = GenerationConfig.from_pretrained(args.model)
    server = VLLMProtocolServer(
        model,
        tokenizer,
        served_model_name=args.served_model_name,
        logprobs_mode=args.logprobs_mode,
        generation_config=config,
        port=args.port,
    )
    print(f"serving {args.model} as {args.served_model_name!r} on {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
