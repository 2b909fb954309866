"""A real small judge (SmolLM2-135M-Instruct) on right and wrong answers written here, locally and behind a loopback
OpenAI-compatible server; and the wall time of a run judged by it against the same run with an instant verifier.

    python scripts/benchmark_judge.py                 # all three parts (a few minutes on a shared 2-core machine)
    python scripts/benchmark_judge.py --parts agreement

Part 1 (agreement): the ``judge`` verifier with the default yes/no template, greedy, SmolLM2 loaded in this process,
judges ANSWERS (16 questions, one right and one wrong reply each). Reported: agreement with the truth and its 95%
Wilson interval, the replies with no verdict (counted as disagreements), the yes rate on right and on wrong replies.

Part 2 (server): the same set, the judge an ``openai:URL#smollm2`` agent against tests/vllm_protocol_server.py (vLLM's
OpenAI protocol over the same model, on 127.0.0.1; token mode, greedy): agreement, and how many verdicts equal
part 1's.

Part 3 (overlap): the policy is SmolLM2 behind that loopback server (a per-request agent: each episode's request goes
out as soon as it is made; the server answers one at a time), 16 questions x 2 rollouts. The same run (same seeds,
same replies) with the ``exact`` verifier (instant) and with the local SmolLM2 judge, interleaved, twice each; then
the judge alone on the replies of the judged run (its calls awaited together, as the run awaits them). If judging
overlapped generation, the judged run takes less than instant run + judge alone. Figures are ratios of runs made
side by side in one process.

Part 4 (latency): the engine's overlap without CPU contention. The policy is the tiny-small model behind the loopback
server (per request); the judge is a remote one, simulated: each call waits ``--judge-latency`` seconds on the loop
(``asyncio.sleep``) and says "yes". The same 32 episodes with ``exact`` and with that judge, interleaved, twice each:
serial judging would add 32 x latency; overlapped, about one latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

ANSWERS = [  # (question, reference, right reply, wrong reply)
    ("What is the capital of France?", "Paris", "The capital of France is Paris.", "The capital of France is Lyon."),
    ("How many legs does a spider have?", "8", "A spider has eight legs.", "A spider has six legs."),
    ("What is 7 times 8?", "56", "7 times 8 is 56.", "7 times 8 is 54."),
    ("Which planet is closest to the Sun?", "Mercury", "Mercury is closest to the Sun.",
     "Venus is closest to the Sun."),
    ("What gas do plants take in for photosynthesis?", "carbon dioxide", "They take in carbon dioxide.",
     "They take in oxygen."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare", "It was written by William Shakespeare.",
     "It was written by Charles Dickens."),
    ("What is the boiling point of water at sea level in Celsius?", "100", "Water boils at 100 degrees Celsius.",
     "Water boils at 90 degrees Celsius."),
    ("How many days are in a week?", "7", "A week has seven days.", "A week has five days."),
    ("What is the largest ocean on Earth?", "the Pacific Ocean", "The Pacific Ocean is the largest.",
     "The Atlantic Ocean is the largest."),
    ("What is the square root of 81?", "9", "The square root of 81 is 9.", "The square root of 81 is 8."),
    ("In which continent is Kenya?", "Africa", "Kenya is in Africa.", "Kenya is in Asia."),
    ("What color do you get by mixing blue and yellow?", "green", "Mixing blue and yellow gives green.",
     "Mixing blue and yellow gives purple."),
    ("What is the chemical symbol for gold?", "Au", "The symbol for gold is Au.", "The symbol for gold is Ag."),
    ("How many minutes are in an hour?", "60", "An hour has 60 minutes.", "An hour has 100 minutes."),
    ("What is the freezing point of water in Fahrenheit?", "32", "Water freezes at 32 degrees Fahrenheit.",
     "Water freezes at 0 degrees Fahrenheit."),
    ("Which animal is known as the king of the jungle?", "the lion", "The lion is called the king of the jungle.",
     "The elephant is called the king of the jungle."),
]  # fmt: skip


def judge_all(judge, items):
    """``(verdicts, seconds)``: every (reply, task) judged, awaited together on the engine loop."""
    from hf_rollouts.aio import ENGINE_LOOP

    async def run():
        return await asyncio.gather(*(judge.ascore(r, None, t) for r, t in items), return_exceptions=True)

    start = time.perf_counter()
    out = ENGINE_LOOP.call(run())
    seconds = time.perf_counter() - start
    from hf_rollouts.verify import NoVerdictError

    failed = [e for e in out if isinstance(e, BaseException) and not isinstance(e, NoVerdictError)]
    if failed:  # a judge that could not run is no timing: say why instead of timing the failures
        raise failed[0]
    return out, seconds


def agreement(judge, label: str) -> list:
    items, truth = [], []
    for question, ref, right, wrong in ANSWERS:
        items += [(right, {"prompt": question, "answer": ref}), (wrong, {"prompt": question, "answer": ref})]
        truth += [1.0, 0.0]
    verdicts, seconds = judge_all(judge, items)
    rewards = [None if isinstance(v, Exception) else v.reward for v in verdicts]
    agree = sum(r == t for r, t in zip(rewards, truth))
    from hf_rollouts.evaluation import wilson_interval

    low, high = wilson_interval(agree, len(truth))
    yes_right = sum(r == 1.0 for r, t in zip(rewards, truth) if t == 1.0)
    yes_wrong = sum(r == 1.0 for r, t in zip(rewards, truth) if t == 0.0)
    print(
        f"[{label}] agreement {agree}/{len(truth)} = {agree / len(truth):.3f} (95% Wilson {low:.3f}-{high:.3f}); "
        f"no verdict {rewards.count(None)}; 'yes' on right replies {yes_right}/16, on wrong ones {yes_wrong}/16; "
        f"{seconds:.1f} s"
    )
    for v in verdicts[:4]:
        print("   ", repr(getattr(v, "info", {}).get("judge_reply", v))[:100])
    return rewards


def overlap(judge, served_url: str, tokenizer_path: str) -> None:
    """``judge``: the local Judge("smollm2", max_new_tokens=4); the runs name the same spec (the same loaded agent)."""
    from hf_rollouts import generate_rollouts
    from hf_rollouts.agents import SamplingConfig, load_agent

    policy = load_agent(
        f"openai:{served_url}#smollm2", SamplingConfig(temperature=0.7, max_new_tokens=24), tokenizer=tokenizer_path
    )
    rows = [
        {
            "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
            "env_config": {"system_prompt": "Answer in one short sentence."},
            "task_data": {"prompt": q, "answer": ref},
        }
        for q, ref, _, _ in ANSWERS
    ]
    judged = {"name": "judge", "model": "smollm2", "max_new_tokens": 4}

    def run(verifier):
        tasks = [{**r, "env_config": {**r["env_config"], "verifier": verifier}} for r in rows]
        start = time.perf_counter()
        out = generate_rollouts(
            tasks, policy, 2, seed=0, progress=False, cache_dir=tempfile.mkdtemp(), allowed_env_models=["smollm2"]
        )
        seconds = time.perf_counter() - start
        print(f"    run with {verifier if isinstance(verifier, str) else 'the judge'}: {seconds:.1f} s", flush=True)
        return out, seconds

    instant, t_instant = run("exact")  # interleaved, twice each: the machine is shared
    with_judge, t_judged = run(judged)
    _, t_instant2 = run("exact")
    _, t_judged2 = run(judged)
    replies = [
        (conv[-1]["content"], json.loads(row["task_data"])) for row in with_judge for conv in row["conversations"]
    ]
    _, t_alone = judge_all(judge, replies)
    statuses = [s for row in with_judge["statuses"] for s in row]
    same = [c[-1]["content"] for r in instant["conversations"] for c in r] == [c for c, _ in replies]
    print(
        f"[overlap] 32 episodes; instant verifier {t_instant:.1f} s, {t_instant2:.1f} s; judged {t_judged:.1f} s, "
        f"{t_judged2:.1f} s; the judge alone on its replies {t_alone:.1f} s; same replies in both runs: {same}; "
        f"judged statuses {dict((s, statuses.count(s)) for s in set(statuses))}"
    )
    base, judged_mean = (t_instant + t_instant2) / 2, (t_judged + t_judged2) / 2
    print(
        f"[overlap] judged run / instant run = {judged_mean / base:.2f}; judged run / (instant run + judge alone) = "
        f"{judged_mean / (base + t_alone):.2f} (1.0 = serial, {base / (base + t_alone):.2f} = fully hidden)"
    )


def latency(seconds: float) -> None:
    from vllm_protocol_server import VLLMProtocolServer

    from hf_rollouts.agents import Agent, SamplingConfig
    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.envs.dataset import DatasetEnv
    from hf_rollouts.tiny_model import build_tiny_model
    from hf_rollouts.types import Action

    class RemoteJudge(Agent):
        """A judge that answers each request after ``seconds`` on the loop (a remote server, simulated)."""

        answers_per_request = True
        calls = 0

        def get_action(self, messages, agent_state=None):
            raise RuntimeError("answered on the loop only")

        async def answer(self, request):
            RemoteJudge.calls += 1
            await asyncio.sleep(seconds)
            return Action(text="yes"), None

    model, tok = build_tiny_model(size="small")
    tasks = [{"prompt": q, "answer": ref} for q, ref, _, _ in ANSWERS]
    times: dict[str, list[float]] = {"exact": [], "judge": []}
    with VLLMProtocolServer(model, tok) as server:
        policy = OpenAIChatAgent(
            base_url=server.url, model="tiny", tokenizer=tok, sampling=SamplingConfig(max_new_tokens=24)
        )
        for _ in range(2):
            for name, verifier in (("exact", "exact"), ("judge", {"name": "judge", "model": RemoteJudge()})):
                env = DatasetEnv(tok, {"verifier": verifier})
                start = time.perf_counter()
                out = env.run_trial(tasks, policy, 2)
                times[name].append(time.perf_counter() - start)
                assert all(s == "done" for s in out["statuses"]), out["errors"]
    base, judged = (sum(times["exact"]) / 2, sum(times["judge"]) / 2)
    print(
        f"[latency] 32 episodes, judge latency {seconds} s ({RemoteJudge.calls} calls): exact "
        f"{[round(t, 2) for t in times['exact']]} s, judged {[round(t, 2) for t in times['judge']]} s; "
        f"judged - instant = {judged - base:.2f} s (serial: {32 * seconds:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["agreement", "server", "overlap", "latency"])
    parser.add_argument("--judge-latency", type=float, default=0.5)
    args = parser.parse_args()
    import torch
    from vllm_protocol_server import VLLMProtocolServer

    from hf_rollouts.smollm2 import load_smollm2, smollm2_path
    from hf_rollouts.verify import Judge

    torch.set_num_threads(1)
    if args.parts == ["latency"]:
        return latency(args.judge_latency)
    local = Judge("smollm2", max_new_tokens=4)
    local.agent()  # load once, not timed
    results = {}
    if "agreement" in args.parts:
        results["local"] = agreement(local, "local SmolLM2 judge")
    model, tok = load_smollm2()
    if "server" in args.parts:
        with VLLMProtocolServer(model, tok, served_model_name="smollm2") as server:
            served = Judge(f"openai:{server.url}#smollm2", max_new_tokens=4, tokenizer=str(smollm2_path()))
            results["server"] = agreement(served, "SmolLM2 judge behind the loopback server")
        if "local" in results:
            same = sum(a == b for a, b in zip(results["local"], results["server"]))
            print(f"[server] verdicts equal to the local judge's: {same}/{len(results['local'])}")
    if "overlap" in args.parts:
        with VLLMProtocolServer(model, tok, served_model_name="smollm2") as server:
            overlap(local, server.url, str(smollm2_path()))
    if "latency" in args.parts:
        latency(args.judge_latency)
    print(json.dumps({"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
