"""Shared fixtures: the real embedded tokenizer and tiny Llama, built once per session."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from hf_rollouts.agents.base import Agent
from hf_rollouts.types import AgentRequest


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_rollouts_cache")
    os.environ["HF_ROLLOUTS_CACHE"] = str(path)
    yield path


@pytest.fixture(scope="session")
def tiny(_cache_dir):
    """The shared tiny model, on the device agents put it on (accelerate's: CUDA on a GPU machine), from the start:
    tests that feed it tensors put them on ``model.device``, whatever ran first."""
    from hf_rollouts.distributed import process_state
    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    return model.to(process_state().device), tok


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture()
def hf_agent(tiny):
    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    return TransformersAgent(model, tok, temperature=1.0, max_new_tokens=10, seed=0)


class RecordingAgent(Agent):
    """Wraps an agent and records, per session, each request's prompt ids and the action returned."""

    def __init__(self, inner: Agent) -> None:
        self.inner = inner
        self.log: dict[str, list[tuple[list[int], object]]] = {}
        self.batch_sizes: list[int] = []

    def get_action(self, messages, agent_state=None):
        return self.inner.get_action(messages, agent_state)

    def act_batch(self, requests: list[AgentRequest]):
        self.batch_sizes.append(len(requests))
        results = self.inner.act_batch(requests)
        for req, result in zip(requests, results):
            if not isinstance(result, BaseException):  # a failed request is passed through as is
                self.log.setdefault(req.session_id, []).append((list(req.prompt_token_ids), result[0]))
        return results

    def act(self, request):
        return self._single(request)

    def set_seed(self, seed):
        self.inner.set_seed(seed)

    def fingerprint(self):
        return {"recording": self.inner.fingerprint()}

    @property
    def tokenizer(self):
        return self.inner.tokenizer


@pytest.fixture()
def recording():
    return RecordingAgent
