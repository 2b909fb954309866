"""The TRL bridge (hf_rollouts.integrations.trl) with real trl 1.16: a short GRPOTrainer run on CPU.

One module-scoped training run of the tiny model on a two-turn toy env is recorded call by call;
the tests below read that record, then call the rollout function directly for edge cases.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import statistics
import tempfile
import threading
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in trl 1.16
trl = pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")

from hf_rollouts.envs.base import MultistepEnv  # noqa: E402
from hf_rollouts.integrations.trl import (  # noqa: E402
    TrainerPolicyAgent,
    TRLSampling,
    env_reward,
    generation_mode,
    make_rollout_func,
    task_from_prompt,
    to_trl_dataset,
)
from hf_rollouts.schema import TaskValidationError, to_task_dataset  # noqa: E402

G = 8  # num_generations
TASKS_PER_STEP = 2
STEPS = 10
MAX_NEW = 3
TEMPERATURE = 0.8  # not 1: the stored log-probs must be log_softmax(logits / T), as TRL recomputes them
LP_TOL = 2e-3


class TwoTurnDigitsEnv(MultistepEnv):
    """Two agent turns; each turn whose answer contains a digit earns 0.5. The env records what it saw."""

    default_max_turns = 2
    seen: ClassVar[dict[str, tuple[list[str], float]]] = {}

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> dict[str, Any]:
        if task_data.get("fail") == "init":
            raise RuntimeError("boom before the first turn")
        return {"sid": session_id, "task": task_data, "actions": []}

    def _format_prompt(self, state: dict[str, Any], step: int) -> str:
        return "Say a number." if step == 0 else "Another number."

    def _step_episode(self, session_id: str, state: dict[str, Any], action: str):
        state["actions"].append(action)
        if state["task"].get("fail") == "step" and len(state["actions"]) == 2:
            raise RuntimeError("boom at the second turn")
        reward = 0.5 if any(c.isdigit() for c in action) else 0.0
        return state, reward, len(state["actions"]) == 2, {}

    def _calculate_reward(self, state: dict[str, Any], step_rewards: list[float]) -> float:
        total = float(sum(step_rewards))
        self.seen[state["sid"]] = (list(state["actions"]), total)
        return total


class GroupDigitsEnv(TwoTurnDigitsEnv):
    """TwoTurnDigitsEnv whose final rewards are ranks within the group (0, 1, ...; ties by order)."""

    groups: ClassVar[list[list[float]]] = []  # the final rewards each group hook call saw

    def _calculate_group_rewards(self, task_data, states, final_rewards):
        self.groups.append(list(final_rewards))
        order = sorted(range(len(states)), key=lambda i: final_rewards[i])
        return [float(order.index(i)) for i in range(len(states))]


ENV_PATH = f"{TwoTurnDigitsEnv.__module__}.TwoTurnDigitsEnv"
ALLOWED = (TwoTurnDigitsEnv.__module__,)


def task_rows(n: int, **task: Any) -> list[dict[str, Any]]:
    return [{"env_class_path": ENV_PATH, "env_config": {}, "task_data": {"k": i % 3, **task}} for i in range(n)]


def teacher_forced(model, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each completion id under ``model``, one unpadded forward pass in the model's
    dtype (the model's own forward: a bf16 run's accelerate wrapper would compute it under autocast)."""
    forward = model.__dict__.get("_original_forward", model)
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
            logits = forward(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1)
    finally:
        model.train(was)
    return lp.tolist()


class Recorder:
    """Wraps the rollout function; records each call and what the model looked like around it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts, trainer):
        model = trainer.model
        before = {
            "modes": [m.training for m in model.modules()],
            "gen": model.generation_config.to_dict(),
            "seed": torch.initial_seed(),
            "device": model.device,
        }
        out = self.inner(prompts, trainer)
        after = {
            "modes": [m.training for m in model.modules()],
            "gen": model.generation_config.to_dict(),
            "seed": torch.initial_seed(),
            "device": model.device,
        }
        tf = [
            teacher_forced(model, p, c, trainer.args.temperature)
            for p, c in zip(out["prompt_ids"], out["completion_ids"])
        ]
        self.calls.append(
            {
                "prompts": list(prompts),
                "out": copy.deepcopy(out),
                "before": before,
                "after": after,
                "teacher_forced": tf,
                "episodes": self.inner.last_episodes,
            }
        )
        return out


def build_trainer(rollout_func, steps: int = STEPS, bf16: bool = False):
    """A GRPOTrainer for CPU on a fresh tiny model (never the session's shared `tiny`)."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    tasks = to_task_dataset(task_rows(TASKS_PER_STEP * steps))
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="test_trl_"),
        max_steps=steps,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        num_generations=G,
        per_device_train_batch_size=TASKS_PER_STEP * G,
        temperature=TEMPERATURE,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        args=args,
        train_dataset=to_trl_dataset(tasks, allowed_env_modules=ALLOWED),
        reward_funcs=[env_reward],
        rollout_func=rollout_func,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


@pytest.fixture(scope="module")
def run():
    rollout = make_rollout_func(max_new_tokens=MAX_NEW, allowed_env_modules=ALLOWED)
    recorder = Recorder(rollout)
    trainer = build_trainer(recorder)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    flushing = torch.set_flush_denormal(True)
    try:
        trainer.train()
    finally:
        if flushing:
            torch.set_flush_denormal(False)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return SimpleNamespace(
        trainer=trainer, rollout=rollout, calls=recorder.calls, logs=logs, initial=initial, tok=trainer.processing_class
    )


@pytest.fixture(scope="module")
def direct():
    """An untrained trainer and a rollout function, for calling the rollout function directly."""
    rollout = make_rollout_func(max_new_tokens=MAX_NEW, allowed_env_modules=ALLOWED)
    trainer = build_trainer(rollout, steps=1)
    return SimpleNamespace(trainer=trainer, rollout=rollout, tok=trainer.processing_class)


# --------------------------------------------------------------------------- the training run


def test_one_row_per_prompt_and_prompts_arrive_repeated(run):
    assert len(run.calls) == STEPS  # one rollout call per optimizer step (steps_per_generation = 1)
    first = run.calls[0]
    prompts, out = first["prompts"], first["out"]
    assert len(prompts) == TASKS_PER_STEP * G
    # TRL's sampler already repeated each prompt G times, consecutively; the groups are distinct task rows
    groups = [prompts[i : i + G] for i in range(0, len(prompts), G)]
    assert all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == TASKS_PER_STEP
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_final_reward", "env_status"):
        assert len(out[key]) == len(prompts), key
    for c, lp, m in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(c) == len(lp) == len(m) > 0
    # the same task played G times gives G different episodes (sampling), each its own row
    assert len({tuple(c) for c in out["completion_ids"][:G]}) > 1


def test_env_mask_marks_exactly_the_agent_turns(run):
    tok = run.tok
    eos = tok.eos_token_id
    for call in (run.calls[0], run.calls[-1]):
        out = call["out"]
        for i, (p, c, m) in enumerate(zip(out["prompt_ids"], out["completion_ids"], out["env_mask"])):
            actions, _ = TwoTurnDigitsEnv.seen[out["env_session_id"][i]]
            segments = [(flag, [t for t, _ in grp]) for flag, grp in itertools.groupby(zip(c, m), key=lambda x: x[1])]
            agent = [ids for flag, ids in segments if flag]
            env = [ids for flag, ids in segments if not flag]
            # the completion alternates: answer, env message, answer (two turns, the episode ends on the agent)
            assert [flag for flag, _ in segments] == [1, 0, 1]
            # each run of model tokens decodes to exactly the action the env received
            assert [tok.decode(ids, skip_special_tokens=True) for ids in agent] == actions
            # the boundary is exact: the env's text starts with what closes the turn, nothing the model sampled
            closing = "\n<|user|>" if agent[0][-1] == eos else "<|end|>\n<|user|>"
            assert tok.decode(env[0]).startswith(closing) and tok.decode(env[0]).endswith("<|assistant|>\n")
            assert "Another number." in tok.decode(env[0])
            assert tok.decode(p).endswith("Say a number.<|end|>\n<|assistant|>\n")  # the agent starts right after
            assert all(lp == 0.0 for lp, flag in zip(out["logprobs"][i], m) if not flag)
            assert all(lp < 0.0 for lp, flag in zip(out["logprobs"][i], m) if flag)


def test_logprobs_match_teacher_forced_pass_before_and_after_updates(run):
    assert any(not torch.equal(v, run.trainer.model.state_dict()[k]) for k, v in run.initial.items())
    for call in (run.calls[0], run.calls[-1]):
        out, tf = call["out"], call["teacher_forced"]
        worst, n = 0.0, 0
        for lps, ref, mask in zip(out["logprobs"], tf, out["env_mask"]):
            for a, b, flag in zip(lps, ref, mask):
                if flag:
                    worst, n = max(worst, abs(a - b)), n + 1
        assert n > len(out["logprobs"]) and worst < LP_TOL, (worst, n)
    # the policy moved between the first and the last call: same check, different numbers
    first_mean = statistics.fmean(x for lps in run.calls[0]["out"]["logprobs"] for x in lps if x)
    last_mean = statistics.fmean(x for lps in run.calls[-1]["out"]["logprobs"] for x in lps if x)
    assert first_mean != pytest.approx(last_mean, abs=1e-3)


def test_env_reward_is_the_envs_reward(run):
    for call in run.calls:
        out = call["out"]
        rewards = env_reward(prompts=call["prompts"], completions=[None] * len(call["prompts"]), **out)
        own = [TwoTurnDigitsEnv.seen[sid][1] for sid in out["env_session_id"]]
        assert rewards == own
        assert all(s == "done" for s in out["env_status"])


def test_model_is_left_as_trl_had_it(run):
    for call in run.calls:
        assert call["before"] == call["after"]
        assert all(call["before"]["modes"])  # TRL calls the rollout in train mode; it stays so


def test_logged_reward_rises_well_beyond_the_starting_spread(run):
    rewards = [h["reward"] for h in run.logs]
    assert len(rewards) == STEPS
    starts, ends = rewards[:3], rewards[-3:]
    rise = statistics.fmean(ends) - statistics.fmean(starts)
    assert rise > 3 * statistics.pstdev(starts) + 0.2, rewards
    assert run.logs[0]["rewards/env_reward/mean"] == pytest.approx(rewards[0])


# --------------------------------------------------------------------------- direct calls


def _prompts(rows: list[dict[str, Any]], repeat: int = 2) -> list[str]:
    ds = to_trl_dataset(to_task_dataset(rows), allowed_env_modules=ALLOWED)
    return [p for p in ds["prompt"] for _ in range(repeat)]


def test_errors_are_none_rewards_and_never_empty_completions(direct):
    rows = task_rows(1) + task_rows(1, fail="init") + task_rows(1, fail="step")
    out = direct.rollout(_prompts(rows), direct.trainer)
    assert out["env_status"] == ["done", "done", "error", "error", "error", "error"]
    assert "boom before the first turn" in out["env_error"][2] and "boom at the second turn" in out["env_error"][4]
    pad = direct.tok.pad_token_id
    # an episode that failed before any agent turn still gives TRL a non-empty, untrained completion
    assert out["completion_ids"][2] == [pad] and out["env_mask"][2] == [0] and out["prompt_ids"][2] == [pad]
    assert all(
        len(c) == len(m) == len(lp) > 0
        for c, m, lp in zip(*(out[k] for k in ("completion_ids", "env_mask", "logprobs")))
    )
    rewards = env_reward(prompts=[], completions=[], **out)
    assert rewards[:2] == out["env_final_reward"][:2] and rewards[2:] == [None] * 4
    assert all(math.isnan(r) for r in out["env_final_reward"][2:])


def test_group_rewards_over_each_prompts_repeats(direct):
    """GRPOTrainer repeats each prompt num_generations times in a row: those episodes are one group for the env's
    group hook, and the group's rewards reach TRL (never the un-grouped ones)."""
    rows = [{**r, "env_class_path": f"{__name__}.GroupDigitsEnv"} for r in task_rows(2)]
    GroupDigitsEnv.groups.clear()
    out = direct.rollout(_prompts(rows, repeat=3), direct.trainer)
    assert [len(g) for g in GroupDigitsEnv.groups] == [3, 3]
    assert out["env_status"] == ["done"] * 6
    assert sorted(out["env_final_reward"][:3]) == sorted(out["env_final_reward"][3:]) == [0.0, 1.0, 2.0]
    assert all("env_state" not in e for e in direct.rollout.last_episodes)


def test_gradient_checkpointing_in_train_mode_still_samples_exactly_with_kv_reuse(direct):
    trainer = direct.trainer
    model = trainer.model
    model.gradient_checkpointing_enable()
    model.train()
    try:
        out = direct.rollout(_prompts(task_rows(3), repeat=2), trainer)
        agent = direct.rollout.last_agent
        assert agent.kv_reused_calls >= 1  # the second turn continued the kept cache (eval mode keeps it)
        assert model.training and model.is_gradient_checkpointing  # restored
    finally:
        model.gradient_checkpointing_disable()
    for p, c, lps, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        ref = teacher_forced(model, p, c, trainer.args.temperature)
        assert max(abs(a - b) for a, b, f in zip(lps, ref, m) if f) < LP_TOL


class FakeVLLMClient:
    """The HTTP boundary: answers every prompt with ``answer`` (log-probs -0.25, -0.5, ...), like trl's
    ``VLLMClient.generate``, and records the requests."""

    def __init__(self, answer: list[int]) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []

    def generate(self, prompts, **kwargs):
        self.requests.append({"prompts": prompts, **kwargs})
        lps = [[-0.25 * (k + 1)] for k in range(len(self.answer))]
        return {
            "prompt_ids": prompts,
            "completion_ids": [list(self.answer) for _ in prompts],
            "logprobs": [lps for _ in prompts],
            "logprob_token_ids": [[[t] for t in self.answer] for _ in prompts],
        }


def _with_vllm(direct, client, prompts):
    trainer = direct.trainer
    trainer.args.use_vllm = True
    trainer.vllm_generation = SimpleNamespace(mode="server", vllm_client=client)
    try:
        return direct.rollout(prompts, trainer)
    finally:
        trainer.args.use_vllm = False
        del trainer.vllm_generation


def test_vllm_server_client_samples_the_turns(direct):
    tok = direct.tok
    answer = tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
    client = FakeVLLMClient(answer)
    trainer = direct.trainer
    out = _with_vllm(direct, client, _prompts(task_rows(2)))
    assert len(client.requests) == 2  # one batched request per turn
    first = client.requests[0]
    assert first["prompts"] == out["prompt_ids"]  # token-id prompts: exactly the episodes' first prompts
    assert first["n"] == 1 and first["max_tokens"] == MAX_NEW and first["temperature"] == trainer.args.temperature
    assert first["logprobs"] == 0 and tok.eos_token_id in first["generation_kwargs"]["stop_token_ids"]
    for c, lps, m, r in zip(out["completion_ids"], out["logprobs"], out["env_mask"], out["env_final_reward"]):
        assert [t for t, f in zip(c, m) if f] == answer * 2
        assert [x for x, f in zip(lps, m) if f] == [-0.25, -0.5] * 2
        assert r == 1.0


# --------------------------------------------------------------------------- how the model is used


def test_bf16_run_samples_without_accelerates_autocast():
    """GRPOConfig(bf16=True) on CPU: accelerate wraps ``model.forward`` in a bf16 autocast, which TRL's unwrapping
    keeps. Sampling must use the model's own forward, in the engine's thread, with gradients off; training stays
    bf16, and the wrapper is back after each rollout call."""
    calls = []  # per call of a Linear: (in a sampling thread, grad on, inference mode, autocast on, output dtype)

    def record(module, args, output):
        calls.append(
            (
                threading.current_thread() is not threading.main_thread(),
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
                torch.is_autocast_enabled("cpu"),
                output.dtype,
            )
        )

    recorder = Recorder(make_rollout_func(max_new_tokens=MAX_NEW, allowed_env_modules=ALLOWED))
    forwards = []

    def spy(prompts, trainer):
        forwards.append(trainer.model.__dict__.get("forward"))
        out = recorder(prompts, trainer)
        forwards.append(trainer.model.__dict__.get("forward"))
        return out

    trainer = build_trainer(spy, steps=1, bf16=True)
    model = trainer.model
    # a Linear inside the backbone: TRL's training forward never calls lm_head (its fused head uses the weight)
    handle = model.model.layers[-1].mlp.down_proj.register_forward_hook(record)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert "_original_forward" in model.__dict__  # accelerate did wrap the forward: this is a real bf16 run
    assert forwards[0] is not None and forwards[0] is forwards[1] is model.__dict__["forward"]
    sampling = [c for c in calls if c[0]]
    training = [c for c in calls if not c[0] and c[1]]
    assert sampling and all(c[1:] == (False, True, False, torch.float32) for c in sampling), set(sampling)
    assert training and all(c[3] and c[4] == torch.bfloat16 for c in training), set(training)
    call = recorder.calls[0]
    assert call["before"] == call["after"]
    out, tf = call["out"], call["teacher_forced"]  # teacher-forced in float32, with the model's own forward
    worst = max(
        abs(a - b)
        for lps, ref, mask in zip(out["logprobs"], tf, out["env_mask"])
        for a, b, flag in zip(lps, ref, mask)
        if flag
    )
    assert worst < LP_TOL


def test_an_exception_during_generation_leaves_the_model_as_trl_had_it(direct, monkeypatch):
    """TRL's unwrap context re-enables gradient checkpointing only when its block ends cleanly."""

    class Interrupt(BaseException):  # like KeyboardInterrupt: not an episode error, it ends the rollout call
        pass

    seen = {}

    def crash(self, requests):
        seen.update(
            forward=self.model.__dict__.get("forward"),
            training=self.model.training,
            checkpointing=self.model.is_gradient_checkpointing,
        )
        raise Interrupt("stopped while sampling")

    monkeypatch.setattr(TrainerPolicyAgent, "act_batch", crash)
    model = direct.trainer.model
    model.gradient_checkpointing_enable()
    model.train()
    model._original_forward = model.forward  # what accelerate's prepare_model does under bf16/fp16 ...

    def wrapper(*args, **kwargs):  # ... with an autocast wrapper in place of this one
        return model._original_forward(*args, **kwargs)

    model.forward = wrapper
    try:
        with pytest.raises(Interrupt, match="stopped while sampling"):
            direct.rollout(_prompts(task_rows(1)), direct.trainer)
        assert seen["forward"] is model._original_forward and not seen["training"] and not seen["checkpointing"]
        assert model.is_gradient_checkpointing and all(m.training for m in model.modules())
        assert model.__dict__["forward"] is wrapper
    finally:
        model.gradient_checkpointing_disable()
        del model.forward, model._original_forward


def test_the_models_own_eos_ids_end_a_turn_too(direct):
    """Llama-3.1 lists <|eom_id|> only in generation_config.eos_token_id; here <|system|> stands for it."""
    tok, trainer = direct.tok, direct.trainer
    model = trainer.model
    extra = tok.convert_tokens_to_ids("<|system|>")
    stops = [tok.eos_token_id, extra]
    seven, eight = (tok.encode(x, add_special_tokens=False) for x in ("7", "8"))
    client = FakeVLLMClient(seven + [extra] + eight)  # a server that samples past the stop: cut after it
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stops
    try:
        with generation_mode(trainer) as m:
            agent = TrainerPolicyAgent(m, tok, TRLSampling.from_args(trainer.args, MAX_NEW))
        out = _with_vllm(direct, client, _prompts(task_rows(1)))
    finally:
        model.generation_config.eos_token_id = saved
    assert agent.stop_ids == stops and agent.config.eos_token_id == stops  # generate() stops on the model's ids
    action = agent._action(seven + [extra] + eight, [-1.0] * (len(seven) + 1 + len(eight)))
    assert action.token_ids == seven + [extra] and action.stopped and action.text == "7"
    assert client.requests[0]["generation_kwargs"]["stop_token_ids"] == stops
    assert out["env_status"] == ["done", "done"] and out["env_num_turns"] == [2, 2]
    for c, m in zip(out["completion_ids"], out["env_mask"]):
        assert [t for t, f in zip(c, m) if f] == (seven + [extra]) * 2


# --------------------------------------------------------------------------- dataset and options


def test_to_trl_dataset_prompts_are_unique_and_map_back_to_the_row():
    rows = task_rows(1) * 3  # identical task data
    ds = to_trl_dataset(to_task_dataset(rows), allowed_env_modules=ALLOWED)
    assert ds.column_names == ["env_class_path", "env_config", "task_data", "prompt"]
    assert len(set(ds["prompt"])) == 3
    for i, prompt in enumerate(ds["prompt"]):
        assert task_from_prompt(prompt) == (i, rows[i])
        assert json.loads(prompt)["hf_rollouts_task"] == i


def test_untrusted_env_and_bad_rows_are_refused_early(direct):
    with pytest.raises(TaskValidationError, match="outside the modules trusted and allowed"):
        to_trl_dataset(to_task_dataset(task_rows(1)))  # the test module was not allowed
    bad = to_task_dataset(
        [{"env_class_path": "hf_rollouts.envs.guess_number.GuessNumberEnv", "env_config": {}, "task_data": {}}] * 2
    ).map(lambda r, i: {"task_data": "oops"} if i == 1 else {}, with_indices=True)
    with pytest.raises(TaskValidationError, match=r"row 1: field 'task_data'"):
        to_trl_dataset(bad)
    with pytest.raises(TaskValidationError, match="is not a task prompt"):
        direct.rollout(["What is 2+2?"] * 2, direct.trainer)
    strict = make_rollout_func(max_new_tokens=MAX_NEW)  # forged prompt naming an untrusted env
    with pytest.raises(TaskValidationError, match=r"prompt 0 \(task row 0\).*outside the modules trusted and allowed"):
        strict(_prompts(task_rows(1)), direct.trainer)


def test_options_are_checked_and_time_limits_reach_the_engine(direct):
    with pytest.raises(TypeError, match="unknown option"):
        make_rollout_func(max_new_token=3)
    with pytest.raises(ValueError, match="episode_timeout"):
        make_rollout_func(episode_timeout=0)
    timed = make_rollout_func(max_new_tokens=MAX_NEW, allowed_env_modules=ALLOWED, step_timeout=5.0, episode_timeout=9)
    assert timed.play_options["step_timeout"] == 5.0 and timed.play_options["episode_timeout"] == 9
    out = timed(_prompts(task_rows(1), repeat=1), direct.trainer)
    assert out["env_status"] == ["done"]
    rows = task_rows(1)
    rows[0]["env_config"] = {**rows[0]["env_config"], "episode_timeout": 1e-6}  # a row's own limit wins
    out = timed(_prompts(rows, repeat=1), direct.trainer)
    assert out["env_status"] == ["error"] and "episode_timeout" in out["env_error"][0]
    assert env_reward(prompts=None, completions=None, **out) == [None]


def test_episodes_of_several_samples_are_refused_with_the_fix(direct):
    """A TRL row holds one completion per prompt: an env playing template_mode 'render' is refused before anything
    runs (to_trl_dataset, and a forged prompt at the rollout function), and an episode of several samples (a
    program env's) at its row, never trained as its last sample alone."""
    import json as _json

    from hf_rollouts.integrations.trl.rollout import episode_to_trl_row
    from hf_rollouts.rollout.recorder import EpisodeRecorder
    from hf_rollouts.types import Action

    rows = task_rows(1)
    rows[0]["env_config"] = {"template_mode": "render"}
    with pytest.raises(TaskValidationError, match=r"row 0: env_config\['template_mode'\] = 'render'.*grpo_update"):
        to_trl_dataset(to_task_dataset(rows), allowed_env_modules=ALLOWED)
    forged = _json.loads(_prompts(task_rows(1), repeat=1)[0])
    forged["env_config"] = {"template_mode": "render"}
    with pytest.raises(TaskValidationError, match=r"prompt 0 \(task row 0\): env_config\['template_mode'\]"):
        direct.rollout([_json.dumps(forged)], direct.trainer)
    tok = direct.tok
    rec = EpisodeRecorder(TwoTurnDigitsEnv(tok, {}).chat)
    for text in ("one", "two"):  # two prompts that do not extend each other: two samples
        text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        rec.add_call(prompt, Action(text="1", token_ids=tok("1", add_special_tokens=False)["input_ids"]))
    episode = rec.finish("done", 1.0)
    assert episode.num_samples == 2
    with pytest.raises(ValueError, match=r"an episode of 2 samples \(\[1, 1\] calls\).*template_mode"):
        episode_to_trl_row(episode, tok.pad_token_id)
    single = EpisodeRecorder(TwoTurnDigitsEnv(tok, {}).chat)
    single.add_call(prompt, Action(text="1", token_ids=tok("1", add_special_tokens=False)["input_ids"]))
    assert episode_to_trl_row(single.finish("done", 1.0), tok.pad_token_id)["completion_ids"]


def test_peft_config_through_build_grpo_trainer_trains_the_adapter_alone():
    """``build_grpo_trainer(..., peft_config=LoraConfig(...))``: TRL wraps the model with peft, a real GRPO step
    with our rollout function moves the adapter's weights and leaves every base weight as it was."""
    peft = pytest.importorskip("peft")
    from hf_rollouts.integrations.trl import build_grpo_trainer
    from hf_rollouts.tiny_model import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    tasks = to_task_dataset(task_rows(2 * TASKS_PER_STEP))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    trainer, rollout = build_grpo_trainer(model, tok, tasks, num_generations=G, tasks_per_step=TASKS_PER_STEP,
                                          max_steps=2, max_new_tokens=MAX_NEW, learning_rate=5e-2,
                                          temperature=TEMPERATURE, peft_config=config,
                                          rollout_options={"allowed_env_modules": ALLOWED})  # fmt: skip
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(trained, peft.PeftModel) and trainer.state.global_step == 2 and rollout.calls == 2
    grads = {n for n, p in trained.named_parameters() if p.requires_grad}
    assert grads and all("lora_" in n for n in grads)
    after = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p
             for n, p in trained.state_dict().items() if "lora_" not in n}  # fmt: skip
    assert after.keys() == base.keys() and all(torch.equal(base[k], after[k]) for k in base)  # base untouched
    moved = [n for n, p in trained.named_parameters() if "lora_B" in n and p.abs().sum() > 0]  # B starts at 0
    print(f"\npeft GRPO: {len(moved)} of {sum('lora_B' in n for n in grads)} lora_B tensors moved; rewards "
          f"{[row.get('reward') for row in trainer.state.log_history]}")  # fmt: skip
    assert moved


def test_merged_tensors_give_the_engine_the_merged_weights_and_leave_the_model_alone():
    """What colocate's reload sync sends for a peft model: the base model's names, each adapted weight plus its
    adapter's delta (peft's own ``merge_and_unload`` to rounding), no ``lora_`` tensor; the model's base weights are
    left bit for bit, where peft's in-place merge and unmerge (TRL's sync) move them by rounding."""
    peft = pytest.importorskip("peft")
    from hf_rollouts.integrations.trl.colocate import merged_tensors
    from hf_rollouts.tiny_model import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    names = set(model.state_dict()) | {"lm_head.weight"}
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, config)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(n)))
    base = {k: v.clone() for k, v in model.state_dict().items()}  # base_layer and lora_ names
    sent = merged_tensors(wrapped)
    assert set(sent) == names and all(torch.equal(base[k], v) for k, v in model.state_dict().items())
    merged = copy.deepcopy(wrapped).merge_and_unload().state_dict()
    assert max((sent[k] - merged[k]).abs().max().item() for k in merged) < 1e-6
    q = "model.layers.0.self_attn.q_proj."
    assert not torch.equal(sent[q + "weight"], base[q + "base_layer.weight"])  # the delta is in
    wrapped.merge_adapter()
    wrapped.unmerge_adapter()
    drift = max((base[k] - v).abs().max().item() for k, v in model.state_dict().items())
    print(f"\nbase weights after one in-place merge + unmerge: max drift {drift:.1e}")
