"""Core types shared by environments, agents and the pipeline.

Everything here is a small dataclass with no behaviour beyond validation, so the
contracts between the parts of the library can be read in one place:

* an environment asks an agent for an action with an :class:`AgentRequest`;
* the agent answers with an :class:`Action` (text, and, when it sampled them
  itself, the exact token ids and their log-probabilities);
* one finished episode is an :class:`Episode` (unpadded, token-level): one or more :class:`Sample` s, the token
  sequences the model conditioned on and sampled (one for an append-only episode);
* :data:`EPISODE_STATUSES` is the closed set of ways an episode can end;
* a tool call the agent made is a :class:`ToolCall`, and what it returned a :class:`ToolResult`
  (:data:`TOOL_STATUSES`).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .sample import Sample, check_sequence

Message = dict[str, Any]
"""One chat message, ``{"role": "system" | "user" | "assistant" | "tool", "content": str}``. In tool
episodes an assistant message may carry ``tool_calls`` (``[{"id", "type": "function", "function": {"name",
"arguments": dict}}]``) and a ``tool`` message ``tool_call_id`` and ``name``, as chat templates expect them."""

Status = Literal["done", "truncated", "error"]
EPISODE_STATUSES: tuple[str, ...] = ("done", "truncated", "error")
"""``done``: the environment ended the episode (won or lost). ``truncated``: a
turn or token budget cut it off before the environment ended it, or the environment
ended it by its own limit (``info["truncated"] = True`` from ``_step_episode``). ``error``: an
exception was raised, or the agent or environment handed over something invalid
(see :class:`Episode`); the episode's reward is NaN, never a fake zero.

The rule (:meth:`Episode.check` and the pipeline enforce it): an episode is
``error`` exactly when its final reward is NaN, and every other episode has
finite per-token and final rewards."""


class StepError(Exception):
    """Raised by an env's ``_step_episode`` to end the episode as ``error`` and keep what the step decided: the message
    is the episode's ``error`` as it is (no class name put in front), ``info`` the last turn's info (the ``infos``
    column), which a failed step otherwise leaves empty. E.g. a verifier that raised: the extracted answer, and which
    function raised what."""

    def __init__(self, message: str, info: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.info = dict(info)


def is_number(value: Any) -> bool:
    """A real number that is not a bool (``True`` is an int to Python, never a reward here); NaN and inf included."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """:func:`is_number` and finite: what a reward handed over by an environment must be."""
    return is_number(value) and math.isfinite(value)


INFO_SCALARS = (str, int, float, bool, type(None))
"""Types of the ``info`` values kept from another ecosystem's step (:func:`scalar_info`)."""


def scalar_info(info: Any) -> dict[str, Any]:
    """The JSON scalar entries of an ``info``/``metadata`` mapping another ecosystem returned (``{}`` for anything
    else): what a turn's ``info`` keeps of it (nested objects, arrays and objects of other types are left out)."""
    if not isinstance(info, dict):
        return {}
    return {str(k): v for k, v in info.items() if isinstance(v, INFO_SCALARS)}


def info_json(info: Any) -> str | None:
    """An env's step ``info`` as JSON text (the ``infos`` rollout column), ``None`` for an empty or missing one.

    Never raises, so an ``info`` that JSON cannot hold never stops a run: mappings become objects (a key that is not
    a ``str`` becomes its ``repr``), lists, tuples and sets arrays, ints and other real numbers (numpy's included)
    ``int``/``float`` (written exactly: ``json.loads`` gives the same float back; NaN and infinities as Python's
    ``json`` writes them, ``NaN``/``Infinity``), anything else its ``repr`` as a string (an object inside itself:
    ``"<cycle>"``).
    """
    if not info:
        return None
    try:
        return json.dumps(_jsonable(info, frozenset()), ensure_ascii=False)
    except Exception as exc:  # e.g. RecursionError for an info nested deeper than Python's stack
        return json.dumps({"info_not_stored": f"{type(exc).__name__}: {_safe_repr(exc)}"})


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} without a repr>"


def _jsonable(value: Any, seen: frozenset[int]) -> Any:
    """``value`` as plain JSON values (see :func:`info_json`)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "tolist") and not isinstance(value, (Mapping, list, tuple)):  # a numpy array or scalar
        try:
            value = value.tolist()
        except Exception:
            return _safe_repr(value)
        if not isinstance(value, (list, tuple)):
            return _jsonable(value, seen)
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        if id(value) in seen:
            return "<cycle>"
        inner = seen | {id(value)}
        if isinstance(value, Mapping):
            return {k if isinstance(k, str) else _safe_repr(k): _jsonable(v, inner) for k, v in value.items()}
        return [_jsonable(v, inner) for v in value]
    return _safe_repr(value)


def reward_rule_violation(status: str, final_reward: float, per_token_rewards: list[float]) -> str | None:
    """What breaks the reward rule (see :data:`EPISODE_STATUSES`) for one episode, or ``None``.

    A reward that is not a number (``None``, a string, a bool) breaks it too: it is reported
    here rather than raised as a ``TypeError`` from ``math.isnan``.
    """
    if not is_number(final_reward):
        return (
            f"status {status!r} with a non-numeric final reward {final_reward!r} ({type(final_reward).__name__}); "
            "the final reward must be a float (NaN exactly for 'error' episodes)"
        )
    bad = next((r for r in per_token_rewards if type(r) is not float and not is_number(r)), None)
    if bad is not None:
        return f"status {status!r} with a non-numeric per-token reward {bad!r} ({type(bad).__name__})"
    if (status == "error") != math.isnan(final_reward):
        return (
            f"status {status!r} with final reward {final_reward}: an episode is 'error' exactly when its final "
            "reward is NaN"
        )
    if status != "error":
        if not math.isfinite(final_reward):
            return f"status {status!r} with non-finite final reward {final_reward}"
        bad = next((r for r in per_token_rewards if not math.isfinite(r)), None)
        if bad is not None:
            return f"status {status!r} with a non-finite per-token reward {bad}"
    return None


TOOL_STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "malformed", "limit", "not_run")
"""How a tool call ended. ``ok``: the tool returned. ``error``: it raised (or an MCP server answered
``is_error``), or it names no tool of the env, or its arguments do not fit the function. ``timeout``: it ran
past ``tool_timeout``. ``malformed``: the call could not be parsed. ``limit``: not run, a ``max_tool_calls``
limit was reached. ``not_run``: made on the episode's last turn, when no agent turn could read a result.
Every status but ``ok`` and ``not_run`` is a tool error (counted in ``num_tool_errors``), and every call
but ``not_run`` ones is answered to the model by a ``tool`` message."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from an agent's sampled turn (see :mod:`hf_rollouts.chat.tool_calls`).

    Attributes:
        name: the tool's name (``""`` when it could not be read).
        arguments: the decoded arguments, or ``None`` for a malformed call.
        id: the call id (the model's own where its format has one, else generated per turn and index).
        raw: the call's text as sampled.
        error: why the call could not be parsed (``None`` for a well-formed call).
    """

    name: str
    arguments: dict[str, Any] | None
    id: str = ""
    raw: str = ""
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave back: the text the model reads, how it ended, how long it ran."""

    call: ToolCall
    content: str
    status: str = "ok"
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in TOOL_STATUSES:
            raise ValueError(f"unknown tool status {self.status!r}; one of {TOOL_STATUSES}")

    @property
    def failed(self) -> bool:
        """Counted as a tool error (see :data:`TOOL_STATUSES`)."""
        return self.status not in ("ok", "not_run")


@dataclass(frozen=True)
class AgentRequest:
    """What an environment hands an agent at one turn.

    Attributes:
        messages: the readable conversation so far, ending with the
            environment's newest user message.
        prompt_token_ids: the exact token ids of the conversation so far, ending
            with the chat template's generation prompt. A token-level agent must
            condition on exactly these ids; they are a prefix of the episode's
            stored ``full_token_ids``.
        agent_state: whatever the agent returned last turn (``None`` at turn 0).
        session_id: the episode's id, unique within a run.
        seed: the sampling seed of this request, derived from (run seed, task row, rollout, turn) by
            the pipeline (:func:`hf_rollouts.rollout.episode_jobs`), so it never depends on which
            requests share a batch or when they are answered. ``None`` outside a seeded run: the
            agent then draws from its own generator.
    """

    messages: list[Message]
    prompt_token_ids: list[int]
    agent_state: Any = None
    session_id: str = ""
    seed: int | None = None


@dataclass(frozen=True)
class Action:
    """An agent's answer to one :class:`AgentRequest`.

    Attributes:
        text: the decoded action that the environment parses.
        token_ids: the ids the agent sampled, in order, including a final
            end-of-turn token if one was sampled. ``None`` for text-only agents;
            the environment then tokenizes ``text`` once.
        logprobs: one sampling log-probability per entry of ``token_ids``, or
            ``None`` when the agent gives none.
        stopped: ``True`` when generation ended on an end-of-turn token,
            ``False`` when it hit its token budget mid-answer.
    """

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    stopped: bool = True

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.token_ids is None:
            raise ValueError("Action.logprobs needs token_ids: log-probabilities belong to sampled ids.")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"Action has {len(self.token_ids)} token_ids but {len(self.logprobs)} logprobs; "
                "give exactly one log-probability per sampled id."
            )


@dataclass
class Turn:
    """One agent turn inside an episode, for people and for checks.

    ``start``/``end`` delimit the agent's ids in ``full_token_ids`` of the sample that holds the turn (the episode's
    own, for one sample); ``start`` is also the number of stored ids the agent was conditioned on (its prompt is
    ``full_token_ids[:start]``).
    """

    start: int
    end: int
    action: str
    reward: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """One complete (unpadded) episode, token by token.

    **Samples.** An episode is one or more :class:`Sample` s. The per-token fields below (``full_token_ids`` ...
    ``logprobs``, ``tool_token_mask``) are its *last* sample: for an append-only episode (every env played with
    ``template_mode: "append"``, the default) the whole episode, as always. ``earlier_samples`` holds every sample
    before it, in order, and ``sample_calls`` how many calls (agent turns) each sample holds, earlier samples first
    and the last entry this episode's own sample; empty means one sample holding every turn. ``turns`` are all the
    episode's turns, in order; a turn's ``start``/``end`` index the sample that holds it (the first
    ``sample_calls[0]`` turns the first sample, and so on). Step rewards lie on their turn's agent tokens in that
    sample; the ``final_reward`` is the episode's, and training gives every sample its episode's advantage.

    Invariants (checked by :meth:`check`):

    * all per-token lists have the same length;
    * ``sampled_token_mask`` (1 = the agent reported this exact id as sampled;
      0 = re-tokenized text of a text-only turn, or not an agent token) is 1
      only where ``agent_token_mask`` is 1;
    * ``per_token_rewards`` is non-zero only where ``agent_token_mask`` is 1;
    * ``tool_token_mask`` (1 on every token of a tool-result delta; empty means all 0) is 1 only
      where ``agent_token_mask`` is 0: tool output is environment text, never trained on;
    * ``logprobs`` (when not ``None``) is 0.0 wherever the mask is 0;
    * ``status == "error"`` iff ``error`` is set iff ``final_reward`` is NaN;
    * a ``done`` or ``truncated`` episode has a finite ``final_reward`` and finite
      ``per_token_rewards`` (NaN or ±inf is never stored as a success);
    * each earlier sample obeys the per-token invariants too (and the reward rule), holds at least one call, and
      ``sample_calls`` (when set) has one entry per sample, matches the earlier samples' ``num_calls`` and sums to
      ``num_turns``.
    """

    full_token_ids: list[int]
    agent_token_mask: list[int]
    sampled_token_mask: list[int]
    per_token_rewards: list[float]
    logprobs: list[float] | None
    final_reward: float
    status: Status
    error: str | None
    num_turns: int
    num_cut_turns: int
    messages: list[Message]
    turns: list[Turn]
    tool_token_mask: list[int] = field(default_factory=list)
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """One record per tool call: ``{"turn", "name", "arguments", "status", "seconds"}``."""
    solved: bool | None = None
    """Whether the task was solved, as the env says it (``info["solved"]`` of its last step that said): ``None``
    when it did not (then :func:`hf_rollouts.rollout.group.settle_solved` compares the final reward with the env's
    ``max_reward``); ``False`` for an ``error`` episode."""
    logprob_settings: dict[str, Any] | None = None
    """How ``logprobs`` were made (:data:`hf_rollouts.schema.LOGPROB_SETTINGS`), set by the expansion from the agent's
    :meth:`~hf_rollouts.agents.base.Agent.logprob_settings`; ``None`` when the agent records none."""
    earlier_samples: list[Sample] = field(default_factory=list)
    """Every sample but the last (the episode's own fields), in order; empty for an append-only episode."""
    sample_calls: list[int] = field(default_factory=list)
    """Calls (agent turns) per sample, earlier samples first, the last entry the episode's own sample; empty: one
    sample holding every turn (:attr:`calls_per_sample` gives the list either way)."""
    policy_version: int | None = None
    """The policy version that sampled the episode (a training loop's update count when its round began), set by
    :func:`hf_rollouts.rounds.collect_rollouts`; ``None`` outside a training loop."""
    env_state: Any = field(default=None, repr=False, compare=False)
    """The env's state object at the end of a ``done``/``truncated`` episode, kept only until the task's group
    rewards are computed (:mod:`hf_rollouts.rollout.group`); never stored in a dataset."""

    @property
    def full_attention_mask(self) -> list[int]:
        return [1] * len(self.full_token_ids)

    @property
    def num_samples(self) -> int:
        """How many samples (stored token sequences) the episode has: 1 for an append-only episode."""
        return len(self.earlier_samples) + 1

    @property
    def calls_per_sample(self) -> list[int]:
        """``sample_calls``, or ``[num_turns]`` for an episode that left it empty (one sample): the stored
        ``sample_calls`` column."""
        return list(self.sample_calls) if self.sample_calls else [self.num_turns]

    @property
    def last_sample(self) -> Sample:
        """The episode's own (last) sample as a :class:`Sample`."""
        return Sample(
            self.full_token_ids,
            self.agent_token_mask,
            self.sampled_token_mask,
            self.per_token_rewards,
            self.logprobs,
            self.calls_per_sample[-1],
        )

    @property
    def samples(self) -> list[Sample]:
        """Every sample of the episode, in order (``earlier_samples`` then :attr:`last_sample`)."""
        return [*self.earlier_samples, self.last_sample]

    # the earlier samples' per-token fields, [sample][token] (the ``earlier_*`` rollout columns; logprobs None
    # for a sample whose agent gave none)
    earlier_token_ids = property(lambda self: [s.full_token_ids for s in self.earlier_samples])
    earlier_agent_token_mask = property(lambda self: [s.agent_token_mask for s in self.earlier_samples])
    earlier_sampled_token_mask = property(lambda self: [s.sampled_token_mask for s in self.earlier_samples])
    earlier_per_token_rewards = property(lambda self: [s.per_token_rewards for s in self.earlier_samples])
    earlier_logprobs = property(lambda self: [s.logprobs for s in self.earlier_samples])

    @property
    def info_json(self) -> str | None:
        """The ``info`` of the episode's last agent turn (what the env's ``_step_episode`` returned for it, with the
        recorder's ``unplaced_reward`` and a group hook's ``group_reward`` where they apply) as JSON text
        (:func:`info_json`); ``None`` when it is empty: no turn, a step that returned no info, or a step that failed
        (an ``error`` episode: see ``error``) other than by a :class:`StepError`, whose ``info`` is kept."""
        return info_json(self.turns[-1].info) if self.turns else None

    def check(self) -> None:
        """Raise ``AssertionError`` if an invariant (see the class docstring) is broken."""
        n = len(self.full_token_ids)
        where = "episode" if not self.earlier_samples else f"sample {len(self.earlier_samples)} (the last)"
        check_sequence(self, where)
        assert not self.tool_token_mask or len(self.tool_token_mask) == n
        assert all(not (t and m) for t, m in zip(self.tool_token_mask, self.agent_token_mask)), (
            "tool mark on an agent token"
        )
        for i, sample in enumerate(self.earlier_samples):
            assert isinstance(sample, Sample), f"earlier_samples[{i}] is a {type(sample).__name__}, not a Sample"
            sample.check(f"sample {i}")
            problem = reward_rule_violation(self.status, self.final_reward, sample.per_token_rewards)
            assert problem is None, f"sample {i}: {problem}"
        if self.sample_calls:
            calls = self.sample_calls
            assert len(calls) == self.num_samples, f"sample_calls {calls} for {self.num_samples} samples"
            assert all(c == s.num_calls for c, s in zip(calls, self.earlier_samples)), (
                f"sample_calls {calls} differ from the earlier samples' num_calls"
            )
            assert sum(calls) == self.num_turns, f"sample_calls {calls} do not sum to num_turns={self.num_turns}"
        else:
            assert not self.earlier_samples, "an episode with earlier samples needs its sample_calls"
        assert self.status in EPISODE_STATUSES, f"unknown status {self.status!r}"
        assert self.solved is None or isinstance(self.solved, bool), f"solved is {self.solved!r}, not a bool"
        assert (self.status == "error") == (self.error is not None), "status 'error' iff an error message"
        problem = reward_rule_violation(self.status, self.final_reward, self.per_token_rewards)
        assert problem is None, problem

    def to_dict(self) -> dict[str, Any]:
        """The unpadded episode dictionary ``_run_complete_episode`` returns: every field but ``env_state`` (which
        never leaves the engine), plus the derived ``full_attention_mask`` and ``info_json``. Its keys are the
        ``source`` names of :data:`hf_rollouts.schema.ROLLOUT_COLUMNS` (``earlier_samples`` as plain dicts)."""
        out = {name: getattr(self, name) for name in _DICT_FIELDS}
        out["earlier_samples"] = [asdict(s) for s in self.earlier_samples]
        for name in _DERIVED:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, episode: dict[str, Any]) -> Episode:
        """The :class:`Episode` of an episode dictionary (:meth:`to_dict`'s keys; ``full_attention_mask`` and
        ``info_json`` and the other derived keys are ignored; ``earlier_samples`` may be :class:`Sample` s or their
        dicts). A missing field raises ``TypeError`` naming it."""
        values = {name: episode[name] for name in _EPISODE_FIELDS if name in episode}
        if values.get("earlier_samples"):
            values["earlier_samples"] = [s if isinstance(s, Sample) else Sample(**s) for s in values["earlier_samples"]]
        return cls(**values)


_EPISODE_FIELDS = tuple(f.name for f in fields(Episode))
_DICT_FIELDS = tuple(name for name in _EPISODE_FIELDS if name != "env_state")
_DERIVED = tuple(n for n, v in vars(Episode).items() if isinstance(v, property) and n not in ("samples", "last_sample"))
"""The derived values :meth:`Episode.to_dict` adds (``full_attention_mask``, ``info_json``, the samples' columns)."""
