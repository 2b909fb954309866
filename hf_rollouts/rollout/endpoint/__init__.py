"""A local OpenAI-compatible endpoint that lets an agent *program* call the run's agent, token-exactly.

* :mod:`.server` — the HTTP server (one per process, on the engine loop, 127.0.0.1 only), one :class:`Session` and
  key per episode, :class:`EndpointAddress`;
* :mod:`.protocol` — the Chat Completions wire format: the request checked (:class:`ChatRequest`), the answer,
  streaming, errors in OpenAI's shape (:class:`APIError`);
* :mod:`.render` — a request's messages to prompt ids (extension or render) and a sampled answer to tool calls;
* :mod:`.steps` — :func:`program_steps`, one program episode as the engine advances it.

The program env (:class:`~hf_rollouts.envs.program.ProgramEnv`) knows only the address it is handed; the agent is the
run's, answering the episode's requests like any other episode's.
"""

from .protocol import SAMPLING_FIELDS, APIError, ChatRequest, Reply
from .render import Conversation, Renderer
from .server import ENDPOINT, EndpointAddress, EndpointServer, Session
from .steps import ProgramError, ProgramOutcome, cut_answer, program_steps

__all__ = [
    "ENDPOINT",
    "SAMPLING_FIELDS",
    "APIError",
    "ChatRequest",
    "Conversation",
    "EndpointAddress",
    "EndpointServer",
    "ProgramError",
    "ProgramOutcome",
    "Renderer",
    "Reply",
    "Session",
    "cut_answer",
    "program_steps",
]
