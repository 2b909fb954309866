"""The same run locally and on a two-node local Ray cluster: wall time, worker start-up, identical rows.

    python scripts/benchmark_ray.py [--num-tasks 16] [--num-rollouts 4] [--shard-size 4] [--model tiny]

Everything stays on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set before ray is imported) and in a temp
dir of its own; the cluster is stopped with cluster.shutdown(), never `ray stop`. Each node offers one CPU, so
each worker runs torch on one thread; the local run is timed at one thread too (same float summation order, so
even the log-probs are identical) and at the process default.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tasks", type=int, default=16)
    parser.add_argument("--num-rollouts", type=int, default=4)
    parser.add_argument("--shard-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()

    import ray
    import torch
    from ray.cluster_utils import Cluster

    from hf_rollouts.agents import load_agent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.executors import LocalExecutor, RayExecutor
    from hf_rollouts.pipeline import generate_rollouts

    agent = load_agent(args.model, SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens))
    tasks = MastermindEnv(agent.tokenizer, {"max_turns": 4}).get_train_dataset(args.num_tasks)
    work = tempfile.mkdtemp(prefix="hfr-bench-")

    def run(executor, name):
        start = time.perf_counter()
        ds = generate_rollouts(
            tasks, agent, args.num_rollouts, seed=0, batch_size=args.batch_size, shard_size=args.shard_size,
            cache_dir=os.path.join(work, name), progress=False, executor=executor,
        )  # fmt: skip
        return ds, time.perf_counter() - start

    default_threads = torch.get_num_threads()
    local_default, t_default = run(LocalExecutor(), "local-default")
    torch.set_num_threads(1)
    local, t_local = run(LocalExecutor(), "local-1")
    torch.set_num_threads(default_threads)

    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="hfr-ray-")
    start = time.perf_counter()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    assert cluster.address.startswith("127.0.0.1:"), cluster.address
    ray.init(address=cluster.address, log_to_driver=False)
    t_cluster = time.perf_counter() - start
    try:
        executor = RayExecutor(num_workers=2)
        remote, t_ray = run(executor, "ray")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(os.environ.pop("RAY_TMPDIR"), ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    episodes = args.num_tasks * args.num_rollouts
    workers = executor.report.workers
    columns = local.column_names
    differ = sorted(c for c in columns if remote[c] != local[c])
    print(
        f"workload: Mastermind, {args.num_tasks} tasks x {args.num_rollouts} rollouts (<= 4 turns, "
        f"<= {args.max_new_tokens} new tokens), model {args.model!r}, shards of {args.shard_size}"
    )
    print(f"local, {default_threads} torch threads: {t_default:.2f} s ({episodes / t_default:.1f} episodes/s)")
    print(f"local, 1 torch thread:   {t_local:.2f} s ({episodes / t_local:.1f} episodes/s)")
    print(f"2-node Ray cluster start: {t_cluster:.2f} s (not in the Ray run's time)")
    print(f"Ray, 2 workers:          {t_ray:.2f} s ({episodes / t_ray:.1f} episodes/s)")
    print(f"  workers' start-up (ask -> agent and envs built): {[w['startup_s'] for w in workers]} s")
    print(f"  of which building the agent: {[w['agent_build_s'] for w in workers]} s")
    print(f"  shards expanded, in commit order: {executor.report.expanded}; pids {[w['pid'] for w in workers]}")
    print(f"identical columns, Ray vs local at 1 thread: {len(columns) - len(differ)}/{len(columns)} {differ or ''}")
    same_default = sum(local_default[c] == local[c] for c in columns)
    print(f"identical columns, local at {default_threads} threads vs 1: {same_default}/{len(columns)}")


if __name__ == "__main__":
    main()
