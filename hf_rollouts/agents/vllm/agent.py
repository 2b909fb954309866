"""vLLM's engine in-process as an agent: one engine request per episode turn, token-in / token-out.

:class:`VLLMAgent` owns a vLLM ``AsyncLLM`` (``vllm.AsyncLLMEngine``, vLLM's V1 async engine; 0.32's
``vllm/v1/engine/async_llm.py``) running on the engine loop (:mod:`hf_rollouts.aio`), the loop the rollout engine
awaits everything on: no loop thread of its own. It is a *per-request* agent (``answers_per_request``): the engine
awaits :meth:`~VLLMAgent.answer` for each turn the moment its episode produces it, and vLLM's continuous
batching (with prefix caching: turn k+1 of an episode extends turn k's ids, so only the new tokens are prefilled)
sees a steady stream of requests, without an HTTP server in between.

**Contract of each answer** (a request that breaks it fails only its own episode, as ``error``):

* the engine is given exactly ``request.prompt_token_ids`` (``TokensPrompt``): no chat template runs, whatever
  the template does to history; the prompt ids the engine reports back (``RequestOutput.prompt_token_ids``) must
  equal them;
* the stored ids are the engine's sampled ids (``CompletionOutput.token_ids``), verbatim, the stop token included
  when one ended the turn (vLLM keeps it as the last id);
* the stored log-probs are the engine's (``logprobs=0``: the sampled token's own log-prob at each position),
  verbatim; :meth:`~VLLMAgent.logprob_convention` says which quantity they are (see below);
* ``stopped`` is ``finish_reason == "stop"`` (a stop id); ``"length"`` (the turn's budget, or the model's context)
  is a cut turn.

**Sampling** comes from :class:`~hf_rollouts.agents.sampling.SamplingConfig` only: every request carries
``temperature`` and ``top_p`` and sets top-k, min-p and the penalties to their neutral values. (vLLM's engine,
unlike its OpenAI server, does not fill unset fields from the model's ``generation_config.json``; only its eos ids
are taken from there, and they are among the stop ids anyway.) Stop ids are the one rule of the local agent
(:func:`hf_rollouts.agents.hf.agent.stop_token_ids`): the tokenizer's eos, the chat template's end token and every
``generation_config.eos_token_id``.

**Seeds**: each request carries its own seed (``request.seed``, from the pipeline's (run seed, task row, rollout,
turn); else one derived from the agent's seed, the session and the turn), so its draws do not depend on the other
requests. vLLM does not promise bitwise batch invariance (only with ``VLLM_BATCH_INVARIANT=1`` on recent NVIDIA
GPUs), so a rerun whose batches are composed differently can differ in the last bits of the logits, and now and
then in a sampled token.

**Log-probs**: ``logprobs_mode="raw"`` (vLLM's default) stores ``log_softmax(logits)`` before temperature, recorded
as ``{"kind": "raw", "temperature": 1.0}``; ``"processed"`` stores ``log_softmax(logits / T)``, hf_rollouts'
convention (``{"kind": "processed", "temperature": T}``), and is refused with ``top_p < 1`` because vLLM takes it
after top-p. The dataset card records the convention and training refuses to mix them.

**Processes**: on CPU (and for ``tensor_parallel_size > 1``) vLLM starts its engine core and workers with the
``spawn`` method, which re-imports the main module: a script that builds a ``VLLMAgent`` needs an
``if __name__ == "__main__":`` guard. :meth:`~VLLMAgent.close` (or the ``with`` block, or interpreter exit) shuts
the engine down.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from concurrent.futures import Future
from dataclasses import asdict, fields
from typing import Any

from ...aio import ENGINE_LOOP
from ...chat import ChatDelta
from ...seeding import derive_seed
from ...types import Action, AgentRequest, Message
from ..base import Agent, ContextLengthError
from ..hf.agent import stop_token_ids
from ..sampling import SamplingConfig, sampling_from_kwargs
from ..stop_strings import cut_at_stop_string
from .engine import (
    WARMUP_NEW_TOKENS,
    build_engine,
    generation_eos,
    imported_vllm,
    load_tokenizer,
    model_files_identity,
    shutdown_engine,
    vllm_installed,
    warm_up_engine,
)
from .settings import (
    SETUP_HINT,
    UNSAMPLED_FIELDS,
    VLLMSettings,
    VLLMUnavailableError,
    check_logprob_settings,
    logprob_convention,
    parse_vllm_spec,
)

_SETTINGS_FIELDS = {f.name for f in fields(VLLMSettings)}
STAT_KEYS = (
    "requests",  # agent turns asked for
    "failures",  # requests that failed: their episodes are recorded as errors
    "prompt_tokens",  # prompt ids sent, over all requests
    "cached_prompt_tokens",  # of those, ids whose KV came from vLLM's prefix cache
    "generated_tokens",  # ids sampled
    "cut_turns",  # answers that ended on the token budget or the context ("length")
)


class VLLMRequestError(RuntimeError):
    """One engine request failed, or its output broke the token contract; only its episode records it."""


class _Stats(dict):
    """``{key: count}`` over :data:`STAT_KEYS`, a plain ``dict`` to read; :meth:`add` is thread-safe."""

    def __init__(self) -> None:
        super().__init__(dict.fromkeys(STAT_KEYS, 0))
        self._lock = threading.Lock()

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self[key] += n


class VLLMAgent(Agent):
    """vLLM's async engine in this process (see the module docstring).

    Args:
        settings: a :class:`~.settings.VLLMSettings`; or give its fields (``model``, ``dtype``,
            ``gpu_memory_utilization``, ``tensor_parallel_size``, ``engine_kwargs``, ...) as keyword arguments.
        sampling: a :class:`~hf_rollouts.agents.sampling.SamplingConfig`; or give its fields as keyword arguments.
        tokenizer: the env tokenizer; default: loaded from ``settings.tokenizer`` or the model (a missing pad token
            becomes the eos token). It must be the engine's tokenizer.

    The engine is built in the constructor (tens of seconds on CPU; the model is loaded), so a bad model or
    setting fails here rather than in every episode.

    Raises:
        VLLMUnavailableError: vLLM cannot be imported in this Python (the message says how to set it up).
        ValueError: ``logprobs_mode="processed"`` with ``top_p < 1``; bad settings.
    """

    answers_per_request = True
    thread_safe = True  # submit() may be called from several threads at once (e.g. by a gamemaster)

    def __init__(
        self,
        settings: VLLMSettings | None = None,
        *,
        sampling: SamplingConfig | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        self.sampling = sampling_from_kwargs(sampling, kwargs)
        if settings is not None and kwargs:
            raise TypeError("Pass either VLLMSettings or its fields as keyword arguments, not both.")
        unknown = sorted(set(kwargs) - _SETTINGS_FIELDS)
        if unknown:
            raise TypeError(f"Unknown VLLMAgent arguments {unknown}; engine arguments go in engine_kwargs={{...}}.")
        self.settings = settings or VLLMSettings(**kwargs)
        check_logprob_settings(self.settings, self.sampling)
        if not vllm_installed():  # before anything slow: a missing vLLM fails at once
            raise VLLMUnavailableError(f"{SETUP_HINT} (no module named 'vllm')")
        s = self.settings
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(s)
        self.name = s.model
        self.chat = ChatDelta(self.tokenizer)
        self.stop_ids = stop_token_ids(self.chat, generation_eos(s))
        self._run_seed = s.seed
        self.stats = _Stats()
        self._engine: Any = None
        self._weights_probe: str | None = None  # set by sync_weights: the probe of the weights the engine holds
        self._lora_request: Any = None  # set by sync_adapter: the current policy's adapter, on every request
        self._lora_version = 0
        self._start()

    @classmethod
    def from_spec(
        cls,
        spec: str,
        *,
        sampling: SamplingConfig | None = None,
        tokenizer: Any = None,
        **options: Any,
    ) -> VLLMAgent:
        """Build from ``"vllm:ID_OR_PATH"``; ``options`` are :class:`~.settings.VLLMSettings` fields, any other key
        goes to ``engine_kwargs`` (as :meth:`VLLMSettings.from_dict`)."""
        return cls(VLLMSettings.from_dict(parse_vllm_spec(spec), options), sampling=sampling, tokenizer=tokenizer)

    # -- the engine -----------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Import vLLM and build the engine on the engine loop (see :func:`~.engine.import_vllm`), so its output
        handler runs there. The build blocks the loop while the model loads (the agent is built before any run)."""
        self._vllm = ENGINE_LOOP.call(imported_vllm())
        s = self.settings
        args, preload, bind = s.engine_args(), s.cpu_preload, s.cpu_threads_bind
        engine = ENGINE_LOOP.call(build_engine(self._vllm, args, preload=preload, bind=bind))
        self.vllm_version = self._vllm.version
        self._engine = engine
        config = engine.vllm_config
        self.max_model_len = int(config.model_config.max_model_len)
        self.engine_config = {  # as vLLM resolved them (the card shows these)
            "device": str(config.device_config.device_type),
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "block_size": config.cache_config.block_size,
            "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "logprobs_mode": str(config.model_config.logprobs_mode),
        }
        self._finalizer = weakref.finalize(self, shutdown_engine, engine)
        if s.warmup or (s.warmup is None and s.enforce_eager):
            self.warm_up()

    def warm_up(self, requests: int | None = None) -> None:
        """:func:`~.engine.warm_up_engine`: ``requests`` (default ``max_num_seqs`` ≤ ``concurrency``) of ≤ 32 tokens."""
        if self._engine is None:
            raise VLLMRequestError("the VLLMAgent was closed; build a new one.")
        n = requests or min(self.settings.concurrency, int(self.engine_config["max_num_seqs"]))
        tokens = min(self.sampling.max_new_tokens, WARMUP_NEW_TOKENS)
        ENGINE_LOOP.call(warm_up_engine(self._vllm, self._engine, requests=n, max_tokens=tokens))

    def close(self) -> None:
        """Shut the engine down (its processes end). Idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        self._engine = None
        if self._lora_request is not None:
            from .adapters import drop_adapter_files

            drop_adapter_files(self)

    def __enter__(self) -> VLLMAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "A VLLMAgent holds a running engine and cannot be pickled; build one in each process that generates."
        )

    # -- Agent API ----------------------------------------------------------------------------------------
    @property
    def concurrency(self) -> int:
        """Requests in flight at once: the engine keeps this many episodes alive by default."""
        return self.settings.concurrency

    def set_seed(self, seed: int) -> None:
        """Seed the requests that carry no seed of their own (every request of a pipeline run carries one)."""
        self._run_seed = seed

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        request = AgentRequest(
            messages=list(messages), prompt_token_ids=self.chat.initial_ids(messages), agent_state=agent_state
        )
        return self._single(request)

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """Every request submitted at once (the engine batches them); answers in order, a failure in its slot."""
        futures = [self.submit(r) for r in requests]
        out: list[tuple[Action, Any] | Exception] = []
        for future in futures:
            try:
                out.append(future.result())
            except Exception as exc:
                out.append(exc)
        return out

    async def answer(self, request: AgentRequest) -> tuple[Action, Any]:
        """Answer one request on the engine loop; ``(action, agent_state)``, or a :class:`VLLMRequestError` (or
        :class:`~hf_rollouts.agents.base.ContextLengthError`)."""
        if self._engine is None:
            raise VLLMRequestError("the VLLMAgent was closed; build a new one.")
        return await self._answer(request)

    def submit(self, request: AgentRequest) -> Future:
        """Hand one request to the engine now; the future holds what :meth:`answer` returns."""
        return ENGINE_LOOP.submit(self.answer(request))

    def reset_prefix_cache(self) -> bool:
        """Drop vLLM's prefix cache (e.g. after new weights were loaded into the engine, whose cached KV would be
        stale; or between benchmark repeats). ``True`` when the engine reset it (it refuses while requests run)."""
        if self._engine is None:
            raise VLLMRequestError("the VLLMAgent was closed; build a new one.")
        return bool(ENGINE_LOOP.call(self._engine.reset_prefix_cache()))

    def sync_weights(self, model: Any) -> Any:
        """Load a transformers ``model``'s current weights into the engine without a restart, drop the prefix
        cache, and move the fingerprint with the weights (:func:`~.weights.sync_weights`; call it between rounds).
        Returns a :class:`~.weights.WeightSync`."""
        from .weights import sync_weights

        return sync_weights(self, model)

    def sync_adapter(self, model: Any) -> Any:
        """Load a peft ``model``'s LoRA adapter into the engine as a new ``LoRARequest`` on every later request (base
        weights kept; needs ``engine_kwargs=lora_engine_kwargs(rank)``), move the fingerprint; between rounds
        (:func:`~.adapters.sync_adapter`, returns an :class:`~.adapters.AdapterSync`)."""
        from .adapters import sync_adapter

        return sync_adapter(self, model)

    def request_seed(self, request: AgentRequest) -> int:
        """The seed of ``request``'s sampling: its own, else one from the agent's seed, its session and its turn."""
        if request.seed is not None:
            return int(request.seed)
        return derive_seed(self._run_seed, request.session_id, len(request.messages))

    def sampling_params(self, request: AgentRequest, max_tokens: int) -> Any:
        """The ``vllm.SamplingParams`` of ``request`` (see the module docstring)."""
        s = self.sampling
        greedy = s.temperature == 0
        return self._vllm.SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=0 if greedy else s.top_k,  # 0: off
            min_p=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            seed=self.request_seed(request),
            max_tokens=max_tokens,
            stop_token_ids=list(self.stop_ids),
            logprobs=0,  # the sampled token's own log-prob only
            # the text is decoded from the ids below, as TransformersAgent does; stop strings need vLLM's
            # detokenizer (it keeps every sampled id and only trims text), and the ids are cut by our rule below
            stop=list(s.stop) or None,
            include_stop_str_in_output=bool(s.stop),
            detokenize=bool(s.stop),
            output_kind=self._vllm.FINAL_ONLY,
        )

    async def _answer(self, request: AgentRequest) -> tuple[Action, Any]:
        self.stats.add(requests=1)
        try:
            prompt = [int(i) for i in request.prompt_token_ids]
            if not prompt:
                raise VLLMRequestError("the request has no prompt_token_ids; the engine is given ids, never text.")
            if len(prompt) >= self.max_model_len:
                raise ContextLengthError(
                    f"the prompt has {len(prompt)} tokens; the engine's context (max_model_len) is "
                    f"{self.max_model_len}. Cap episodes below it with env_config 'max_episode_tokens' to truncate "
                    "them instead."
                )
            params = self.sampling_params(request, min(self.sampling.max_new_tokens, self.max_model_len - len(prompt)))
            engine_input = await self._engine_input(prompt)
            final = None
            lora, rid = self._lora_request, f"hfr-{uuid.uuid4().hex}"  # the adapter of the current version, if any
            async for output in self._engine.generate(engine_input, params, request_id=rid, lora_request=lora):
                final = output
            return self._to_action(request, prompt, final), request.agent_state
        except ContextLengthError:
            self.stats.add(failures=1)
            raise
        except Exception as exc:
            self.stats.add(failures=1)
            if isinstance(exc, VLLMRequestError):
                raise
            raise VLLMRequestError(
                f"the request for session {request.session_id!r} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _engine_input(self, prompt: list[int]) -> Any:
        """``prompt`` as the engine's input: rendered by the engine's renderer as vLLM 0.32's token-in/token-out
        server does (``render_cmpl_async([TokensPrompt])``: ids used as given, length checked against the context);
        a bare ``TokensPrompt`` on versions without a renderer."""
        tokens = self._vllm.TokensPrompt(prompt_token_ids=prompt)
        renderer = getattr(self._engine, "renderer", None)
        if renderer is None or not hasattr(renderer, "render_cmpl_async"):
            return tokens
        (engine_input,) = await renderer.render_cmpl_async([tokens])
        return engine_input

    def _to_action(self, request: AgentRequest, prompt: list[int], output: Any) -> Action:
        """The :class:`Action` of the engine's final ``RequestOutput`` for ``prompt``, checked (module docstring).

        The one place engine outputs become actions: ids and log-probs are copied, never re-derived."""
        where = f"vLLM request for session {request.session_id!r}"
        if output is None or not output.finished or not output.outputs:
            raise VLLMRequestError(f"{where}: the engine returned no finished output.")
        if output.prompt_token_ids is not None and list(output.prompt_token_ids) != prompt:
            raise VLLMRequestError(
                f"{where}: token contract broken: the engine conditioned on {len(output.prompt_token_ids)} prompt ids "
                f"that differ from the {len(prompt)} sent."
            )
        completion = output.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise VLLMRequestError(f"{where}: finished with {completion.finish_reason!r} (aborted or failed).")
        ids = [int(i) for i in completion.token_ids]
        if not ids:
            raise VLLMRequestError(f"{where}: the engine sampled no token.")
        positions = completion.logprobs
        if positions is None or len(positions) != len(ids):
            found = 0 if positions is None else len(positions)
            raise VLLMRequestError(f"{where}: {found} log-prob entries for {len(ids)} sampled ids.")
        logprobs = []
        for tid, at in zip(ids, positions):
            entry = at.get(tid) if at is not None else None
            if entry is None:
                raise VLLMRequestError(f"{where}: no log-prob for the sampled id {tid}.")
            logprobs.append(float(entry.logprob))
        stopped = completion.finish_reason == "stop"
        if self.sampling.stop:
            ids, logprobs, at_stop = cut_at_stop_string(self.tokenizer, ids, logprobs, self.sampling.stop)
            stopped = stopped or at_stop
        self.stats.add(
            prompt_tokens=len(prompt),
            cached_prompt_tokens=int(output.num_cached_tokens or 0),
            generated_tokens=len(ids),
            cut_turns=int(not stopped),
        )
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped)

    # -- what the card and the cache key say ------------------------------------------------------------
    def logprob_convention(self) -> dict[str, Any]:
        """What the stored log-probs are (:func:`~.settings.logprob_convention`)."""
        return logprob_convention(self.settings, self.sampling)

    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes samples: the model (and its files' identity), vLLM's version, every engine
        setting but :data:`~.settings.UNSAMPLED_FIELDS`, sampling, stop ids and the log-prob convention; after
        :meth:`sync_weights`, the probe of the weights loaded (``weights_probe``), which moves with every sync of other
        weights."""
        settings = {k: v for k, v in asdict(self.settings).items() if k not in UNSAMPLED_FIELDS}
        synced = {} if self._weights_probe is None else {"weights_probe": self._weights_probe}
        return {
            **synced,
            **self._identity(),
            "model": self.settings.model,
            "model_files": model_files_identity(self.settings),
            "vllm": self.vllm_version,
            "settings": settings,
            "sampling": {**asdict(self.sampling), "seed": self._run_seed},
            "stop_token_ids": list(self.stop_ids),
            "logprob_convention": self.logprob_convention(),
        }

    def describe(self) -> dict[str, Any]:
        """What the dataset card says: model, engine setup as vLLM resolved it, sampling, log-prob convention."""
        s = self.settings
        return {
            "model": s.model,
            "backend": "vllm (in-process AsyncLLM engine)",
            "vllm": self.vllm_version,
            "sampling": {**asdict(self.sampling), "seed": self._run_seed},
            "logprob_convention": self.logprob_convention(),
            "stop_token_ids": list(self.stop_ids),
            "engine": {**self.engine_config, "enforce_eager": s.enforce_eager, "engine_kwargs": s.engine_kwargs},
            "concurrency": s.concurrency,
        }
