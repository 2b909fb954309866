"""Token bookkeeping for one episode.

:class:`EpisodeRecorder` is the only place that appends to an episode's token
sequence, so the token-level contracts are enforced in one spot:

* environment text enters as chat-template deltas (:class:`~hf_rollouts.chat.ChatDelta`);
* agent ids enter exactly as the agent sampled them (a text-only agent's text is
  tokenized once, inside the template's assistant framing);
* a step's reward is put on that step's agent tokens (see :data:`REWARD_PLACEMENTS`);
* in a tool environment, the calls of a turn that ended on an end token are parsed from its ids decoded
  with special tokens (:meth:`EpisodeRecorder.tool_calls`), and their results enter as one tool-result
  delta (:meth:`EpisodeRecorder.add_tool_results`), marked in the tool mask; each call is recorded.

It also refuses what would be stored silently wrong, by raising before anything is
appended (the episode loop then records the episode as ``error`` with the message):

* an environment message or system prompt that is not a ``str`` (:class:`EnvOutputError`);
* an agent answer that is not an :class:`~hf_rollouts.types.Action` whose ``text`` is a
  ``str`` (``None``, a dict, a number: never played as its ``repr``), ids that are not
  ints in ``[0, len(tokenizer))``, or log-probabilities that do not match the ids one to
  one (:class:`AgentOutputError`);
* a step reward or final reward that is not a finite number (:class:`EnvOutputError`):
  see the reward rule in :mod:`hf_rollouts.types`.

**Truncation reported by the environment.** An env whose own rules cut an episode short (an external
env's turn limit, a time budget: Gymnasium's ``truncated``, as opposed to won or lost) returns
``done=True`` with ``info["truncated"] = True`` from ``_step_episode``; the episode is then stored as
``truncated``, never ``done``. ``info["truncated"]`` must be a bool, and ``True`` only on the step
that ends the episode (:data:`TRUNCATED_KEY`; anything else is an :class:`EnvOutputError`).

**Solved, as the environment says it.** ``info["solved"]`` (a bool; :data:`SOLVED_KEY`) on a step says whether the
task is solved; the last step that says it decides ``Episode.solved``. An env that never says leaves it ``None``,
and the final reward decides against the env's ``max_reward`` (:func:`~hf_rollouts.rollout.group.settle_solved`).

**Samples.** :meth:`EpisodeRecorder.add_call` records one model call from the exact prompt ids the model was
conditioned on: a prompt that extends the current sample joins it, any other closes it and starts a new sample
(:mod:`hf_rollouts.sample`); ``template_mode="render"`` plays an env's turns that way, each prompt the template's
full render of the conversation (:mod:`.samples`). Step rewards land on the agent tokens of the call's own sample.

**Info, kept.** Each step's ``info`` is kept on its :class:`~hf_rollouts.types.Turn`; the last turn's is stored with the
rollout as JSON text (the ``infos`` column, :attr:`~hf_rollouts.types.Episode.info_json`), whatever it holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..chat import ChatDelta
from ..chat.tool_turns import ToolTurns
from ..sample import extends
from ..types import Action, AgentRequest, Episode, Message, Status, ToolCall, ToolResult, Turn, is_number
from .samples import TEMPLATE_MODES, SampleSplit, check_action, check_prompt_ids, full_render, message_problem, show
from .samples import AgentOutputError as AgentOutputError  # raised by check_action; importable from here as before

REWARD_PLACEMENTS = ("last", "spread")
"""How a step reward lands on tokens. ``"last"`` (default): the whole reward on
the last agent token of that step, so a return-to-go computed from the tokens
equals the environment's. ``"spread"``: split evenly over that step's agent
tokens. Either way the per-token rewards of an episode sum to the sum of its
step rewards, and non-agent tokens always get 0. A step whose action has no
tokens puts its reward on the previous agent token; before any agent token it
is recorded in ``Episode.turns[i].info["unplaced_reward"]``."""


TRUNCATED_KEY = "truncated"
"""The ``info`` key of ``_step_episode`` by which an env says its own rules truncated the episode (see above)."""

SOLVED_KEY = "solved"
"""The ``info`` key of ``_step_episode`` by which an env says the task is solved (a bool; see above)."""


class EnvOutputError(ValueError):
    """The environment handed over a message or reward that cannot be stored."""


def _check_reward(value: Any, what: str) -> float:
    """``value`` as a float, or :class:`EnvOutputError` when it is not a finite real number."""
    if not is_number(value):
        raise EnvOutputError(f"{what} must be a finite number, got {type(value).__name__} {show(value)}.")
    value = float(value)
    if not math.isfinite(value):
        raise EnvOutputError(
            f"{what} is {value}: rewards must be finite (an episode whose reward is not a number is an error)."
        )
    return value


def place_reward(rewards: list[float], mask: Sequence[int], turn: Turn, reward: float, placement: str) -> None:
    """Add ``reward`` to ``turn``'s agent tokens in ``rewards`` by ``placement`` (:data:`REWARD_PLACEMENTS`); a turn
    without tokens puts it on the previous agent token, or, before any, in ``turn.info["unplaced_reward"]``."""
    if reward == 0.0:
        return
    if turn.end > turn.start:
        if placement == "last":
            rewards[turn.end - 1] += reward
        else:
            share = reward / (turn.end - turn.start)
            for i in range(turn.start, turn.end):
                rewards[i] += share
        return
    agent_positions = [i for i, m in enumerate(mask[: turn.start]) if m]
    if agent_positions:
        rewards[agent_positions[-1]] += reward
    else:
        turn.info["unplaced_reward"] = turn.info.get("unplaced_reward", 0.0) + reward


class EpisodeRecorder:
    """Builds one :class:`~hf_rollouts.types.Episode` turn by turn."""

    def __init__(
        self,
        chat: ChatDelta,
        reward_placement: str = "last",
        tools: ToolTurns | None = None,
        template_mode: str = "append",
    ) -> None:
        if reward_placement not in REWARD_PLACEMENTS:
            raise ValueError(f"reward_placement must be one of {REWARD_PLACEMENTS}, got {reward_placement!r}")
        if template_mode not in TEMPLATE_MODES:
            raise ValueError(f"template_mode must be one of {TEMPLATE_MODES}, got {template_mode!r}")
        self.template_mode = template_mode
        self.split = SampleSplit()  # the closed samples (add_call)
        self.pending: list[int] | None = None  # render mode: the next prompt, the template's render of messages
        self.chat = chat
        self.tools = tools  # set for an env with executable tools: turns are parsed for calls
        self.reward_placement = reward_placement
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.rewards: list[float] = []
        self.logprobs: list[float] = []
        self.sampled: list[int] = []
        self.any_logprobs = False
        self.messages: list[Message] = []
        self.turns: list[Turn] = []
        self._last_agent_ids: list[int] = []
        self._last_ended = False  # did the last agent turn end with an end-of-turn token (see ChatDelta)
        self.cut_turns = 0  # agent turns that hit the token budget before an end-of-turn token
        self.tool_mask: list[int] = []
        self.tool_records: list[dict[str, Any]] = []
        self.num_tool_calls = 0
        self.num_tool_errors = 0
        self.env_truncated = False  # the env said info["truncated"] = True (must end the episode)
        self.env_solved: bool | None = None  # the last info["solved"] the env gave

    @classmethod
    def for_env(cls, env: Any) -> EpisodeRecorder:
        """The recorder of one episode of ``env`` (its chat, ``reward_placement`` and ``template_mode``)."""
        return cls(env.chat, env.reward_placement, template_mode=getattr(env, "template_mode", "append"))

    def _append(
        self,
        ids: Sequence[int],
        agent: bool,
        logprobs: Sequence[float] | None = None,
        sampled: bool = False,
        tool: bool = False,
    ) -> None:
        self.ids.extend(ids)
        self.mask.extend([int(agent)] * len(ids))
        self.tool_mask.extend([int(tool)] * len(ids))
        self.sampled.extend([int(sampled)] * len(ids))
        self.rewards.extend([0.0] * len(ids))
        if logprobs is not None:
            self.logprobs.extend(logprobs)
        else:
            self.logprobs.extend([math.nan if agent else 0.0] * len(ids))

    def add_env_message(
        self, content: str, system: str | None = None, history: list[dict[str, str]] | None = None
    ) -> None:
        """Append the environment's message (and, first turn only, an optional system prompt and ``history``: earlier
        user / assistant messages the episode opens with, e.g. few-shot examples; environment tokens)."""
        if not isinstance(content, str):
            raise EnvOutputError(
                f"the environment's message (_format_prompt) must be a str, got {type(content).__name__} "
                f"{show(content)}."
            )
        if system is not None and not isinstance(system, str):
            raise EnvOutputError(
                f"the system prompt (_system_prompt) must be a str or None, got {type(system).__name__} {show(system)}."
            )
        if history and self.messages:
            raise ValueError("Prompt history can only open an episode.")
        if not self.messages:
            past = [{"role": m["role"], "content": m["content"]} for m in history or []]
            opening = (
                ([{"role": "system", "content": system}] if system else [])
                + past
                + [{"role": "user", "content": content}]
            )
            self.messages.extend(opening)
            if self.template_mode == "append":
                self._append(self.chat.initial_ids(opening), agent=False)
        else:
            if system:
                raise ValueError("A system prompt can only open an episode.")
            self.messages.append({"role": "user", "content": content})
            if self.template_mode == "append":
                delta = self.chat.user_delta_ids(content, self._last_agent_ids, ended=self._last_ended)
                self._append(delta, agent=False)
        if self.template_mode == "render":
            self.pending = full_render(self.chat, self.messages)

    @property
    def context_length(self) -> int:
        """Tokens of the next prompt: the stored ids (append mode) or the pending full render (render mode)."""
        return len(self.pending) if self.pending is not None else len(self.ids)

    def request(self, agent_state: Any, session_id: str, seed: int | None = None) -> AgentRequest:
        return AgentRequest(
            messages=list(self.messages),
            prompt_token_ids=list(self.pending if self.pending is not None else self.ids),
            agent_state=agent_state,
            session_id=session_id,
            seed=seed,
        )

    def _check_action(self, action: Any) -> None:
        """Raise :class:`AgentOutputError` saying what the agent returned, unless ``action`` can be stored."""
        check_action(action, len(self.chat.tokenizer))

    def add_action(self, action: Action) -> str:
        """Append the agent's tokens; returns the action text the environment must parse.

        Raises :class:`AgentOutputError` (nothing appended) when the action cannot be stored. In render mode the
        action is recorded as a call conditioned on the pending render (:meth:`add_call`).
        """
        if self.pending is not None:
            prompt, self.pending = self.pending, None
            self.add_call(prompt, action)
            return action.text
        self._check_action(action)
        self._add_agent(action)
        self.messages.append({"role": "assistant", "content": action.text})
        return action.text

    def add_call(self, prompt_ids: Sequence[int], action: Action, messages: list[Message] | None = None) -> bool:
        """Record one model call: the exact ``prompt_ids`` the model was conditioned on, and its ``action`` (the
        sampled ids and log-probs; a text-only action is tokenized once, as in :meth:`add_action`).

        When the current sample's stored ids are a prefix of ``prompt_ids`` the call joins it: the prompt's tail
        enters as env tokens, the sampled ids as agent tokens. Otherwise the current sample is closed (kept in
        ``Episode.earlier_samples``) and a new one starts whose env tokens are the whole prompt. Either way the
        prompt is a prefix of the stored sample, and the call is a turn (``reward_turn`` puts its step reward on its
        agent tokens, in this sample). ``messages``: the request's readable conversation; the episode's becomes
        ``messages`` plus the assistant's answer (default: the answer appended to the recorded conversation).
        Returns ``True`` when the call started a new sample (a branch; an episode's first call returns ``False``).

        Raises :class:`AgentOutputError` (nothing recorded) when the prompt or the action cannot be stored, and
        :class:`EnvOutputError` when ``messages`` cannot (:func:`~.samples.message_problem`).
        """
        prompt = check_prompt_ids(prompt_ids, len(self.chat.tokenizer))
        self._check_action(action)
        if messages is not None and (problem := message_problem(messages)) is not None:
            raise EnvOutputError(f"add_call: {problem}.")
        branched = not extends(prompt, self.ids)
        if branched:
            self.split.close(self, len(self.turns))
            self.ids, self.mask, self.sampled, self.rewards, self.logprobs, self.tool_mask = [], [], [], [], [], []
            self.any_logprobs = False
        self._append(prompt[len(self.ids) :], agent=False)
        self._add_agent(action)
        if messages is not None:
            self.messages = [dict(m) for m in messages]
        self.messages.append({"role": "assistant", "content": action.text})
        return branched

    def _add_agent(self, action: Action) -> None:
        """Append a checked action's tokens as one turn (the ids as sampled, or the text in the assistant framing)."""
        start = len(self.ids)
        if action.token_ids is not None:
            ids = [int(t) for t in action.token_ids]
            if action.logprobs is not None:
                self.any_logprobs = True
            logprobs = None if action.logprobs is None else [float(p) for p in action.logprobs]
            self._append(ids, agent=True, logprobs=logprobs, sampled=True)
        else:
            ids = self.chat.assistant_turn_ids(action.text, stopped=action.stopped)  # with the template's framing
            self._append(ids, agent=True)
        self._last_agent_ids = ids
        self._last_ended = self.chat.turn_ended(ids, action.stopped)
        self.turns.append(Turn(start=start, end=len(self.ids), action=action.text, reward=0.0))
        self.cut_turns += int(not action.stopped)

    def tool_calls(self) -> tuple[str, list[ToolCall]]:
        """The content and tool calls of the last agent turn, ``("", [])`` when there are none to run: the env has
        no executable tools, or the turn did not end on an end token (a call cut by the token budget is never
        run). Parsed from the turn's ids decoded *with* special tokens, without the end token
        (:mod:`hf_rollouts.chat.tool_calls`); each call gets its id (the model's own, or generated)."""
        fmt = self.tools.format if self.tools is not None else None
        ids = self._last_agent_ids
        if fmt is None or not self._last_ended or not ids:
            return "", []
        text = self.chat.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        end = self.chat.tokenizer.convert_ids_to_tokens(ids[-1])
        content, calls = fmt.parse(text, end)
        turn = len(self.turns) - 1
        return content, [
            ToolCall(c.name, c.arguments, fmt.call_id(c.id, turn, i), c.raw, c.error) for i, c in enumerate(calls)
        ]

    def _record_calls(self, content: str, results: list[ToolResult]) -> None:
        """The last assistant message carries the calls; each call is recorded and counted."""
        turn = len(self.turns) - 1
        message = {"role": "assistant", "content": content, "tool_calls": []}
        for r in results:
            c = r.call
            arguments = json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None else c.raw
            message["tool_calls"].append(
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments}}
            )
            record = {"turn": turn, "name": c.name, "arguments": arguments, "status": r.status, "seconds": r.seconds}
            self.tool_records.append(record)
            self.num_tool_calls += 1
            self.num_tool_errors += int(r.failed)
        self.messages[-1] = message

    def add_tool_results(self, content: str, results: list[ToolResult]) -> None:
        """Append the results of the last turn's calls as one tool-result delta (environment tokens, tool mask 1):
        the ``tool`` messages rendered by the model's template after the turn's end token, and the generation
        prompt (:class:`~hf_rollouts.chat.tool_turns.ToolTurns`). ``content``: the turn's text outside its calls.

        Raises :class:`EnvOutputError` (nothing appended) when a result's content is not a ``str``."""
        for r in results:
            if not isinstance(r.content, str):
                raise EnvOutputError(
                    f"tool call {r.call.name!r} answered {type(r.content).__name__} {show(r.content)}; a "
                    "ToolResult's content must be a str."
                )
        assert self.tools is not None, "add_tool_results needs the env's ToolTurns"
        calls = [r.call for r in results]
        delta = self.tools.result_ids(calls, [r.content for r in results])
        self._record_calls(content, results)
        self.messages.extend(self.tools.tool_messages(calls, [r.content for r in results]))
        if self.template_mode == "render":
            self.pending = full_render(self.chat, self.messages)
        else:
            self._append(delta, agent=False, tool=True)

    def record_unanswered(self, content: str, results: list[ToolResult]) -> None:
        """Record the last turn's calls without appending anything (the episode ends before a result is read)."""
        self._record_calls(content, results)

    def reward_turn(self, reward: float, info: dict[str, Any] | None = None, done: bool | None = None) -> None:
        """Record the reward of the last turn on its agent tokens (see :data:`REWARD_PLACEMENTS`).

        Raises :class:`EnvOutputError` (nothing recorded) when ``reward`` is not a finite number, or when
        ``info["truncated"]`` is set on a step that does not end the episode (``done`` given and false).
        """
        reward = _check_reward(reward, f"the step reward of turn {len(self.turns) - 1} (_step_episode)")
        self._check_truncated(info)
        if info and SOLVED_KEY in info:
            if not isinstance(info[SOLVED_KEY], bool):
                raise EnvOutputError(
                    f"_step_episode returned info[{SOLVED_KEY!r}] = {show(info[SOLVED_KEY])} "
                    f"({type(info[SOLVED_KEY]).__name__}); it must be a bool (whether the task is solved)."
                )
            self.env_solved = info[SOLVED_KEY]
        if self.env_truncated and done is not None and not done:
            raise EnvOutputError(
                f"_step_episode returned info[{TRUNCATED_KEY!r}] = True with done=False at turn "
                f"{len(self.turns) - 1}: return done=True with it (the step that truncates the episode ends it)."
            )
        turn = self.turns[-1]
        turn.reward = reward
        turn.info = dict(info or {})
        place_reward(self.rewards, self.mask, turn, reward, self.reward_placement)

    def _check_truncated(self, info: dict[str, Any] | None) -> None:
        """Record ``info["truncated"]``; :class:`EnvOutputError` if it is not a bool."""
        flag = (info or {}).get(TRUNCATED_KEY, False)
        if not isinstance(flag, bool):
            raise EnvOutputError(
                f"_step_episode returned info[{TRUNCATED_KEY!r}] = {show(flag)} ({type(flag).__name__}); it must be "
                "a bool (True: the env's own limit ended the episode, stored as 'truncated')."
            )
        self.env_truncated = flag

    def snapshot_error(self, error: str) -> Episode:
        """An ``error`` episode from a *copy* of what is recorded so far, for an episode abandoned while one of its
        hooks still runs in another thread (which may go on appending to this recorder)."""
        n = min(
            len(self.ids), len(self.mask), len(self.sampled), len(self.rewards), len(self.logprobs), len(self.tool_mask)
        )
        copy = EpisodeRecorder(self.chat, self.reward_placement)
        copy.split = self.split.copy()
        copy.ids, copy.mask, copy.sampled = self.ids[:n], self.mask[:n], self.sampled[:n]
        copy.tool_mask, copy.tool_records = self.tool_mask[:n], list(self.tool_records)
        copy.num_tool_calls, copy.num_tool_errors = self.num_tool_calls, self.num_tool_errors
        copy.rewards, copy.logprobs, copy.any_logprobs = self.rewards[:n], self.logprobs[:n], self.any_logprobs
        copy.messages = list(self.messages)
        first = copy.split.first_turn  # the current sample's turns index its ids; earlier ones are closed
        copy.turns = self.turns[:first] + [t for t in self.turns[first:] if t.end <= n]
        copy.cut_turns = self.cut_turns
        return copy.finish("error", math.nan, error=error)

    def finish(self, status: Status, final_reward: float, error: str | None = None, env_state: Any = None) -> Episode:
        """The finished :class:`Episode`. A ``done``/``truncated`` episode whose ``final_reward`` is
        not a finite number becomes ``error`` (the reward rule of :mod:`hf_rollouts.types`); a ``done``
        episode whose last step said ``info["truncated"] = True`` becomes ``truncated``."""
        if status == "done" and self.env_truncated:
            status = "truncated"  # the env ended the episode by its own limit, not by winning or losing
        if status != "error":
            try:
                final_reward = _check_reward(final_reward, "the final reward (_calculate_reward)")
            except EnvOutputError as exc:
                status, error = "error", f"{type(exc).__name__}: {exc}"
        if status == "error":
            final_reward = math.nan
        episode = Episode(
            full_token_ids=self.ids,
            agent_token_mask=self.mask,
            sampled_token_mask=self.sampled,
            per_token_rewards=self.rewards,
            logprobs=self.logprobs if self.any_logprobs else None,
            final_reward=float(final_reward),
            status=status,
            error=error,
            num_turns=len(self.turns),
            num_cut_turns=self.cut_turns,
            messages=self.messages,
            turns=self.turns,
            tool_token_mask=self.tool_mask,
            num_tool_calls=self.num_tool_calls,
            num_tool_errors=self.num_tool_errors,
            tool_calls=self.tool_records,
            solved=False if status == "error" else self.env_solved,
            env_state=None if status == "error" else env_state,
            earlier_samples=list(self.split.earlier),
            sample_calls=self.split.calls(len(self.turns)),
        )
        episode.check()
        return episode
