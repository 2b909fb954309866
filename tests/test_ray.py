"""The Ray executor on a two-node local Ray cluster (ray.cluster_utils.Cluster, everything on 127.0.0.1).

Output equals a local run; a SIGKILLed worker's shard is redone and every shard is committed once; a killed driver
leaves finished shards that a rerun (locally) does not redo; a shard that keeps failing or runs past its deadline
stops the run with an error naming it; a worker whose agent is not the driver's is refused. The cluster is stopped
with cluster.shutdown() (never `ray stop`, which kills every Ray process on the machine by name). When Ray cannot
start here, every test is skipped with the reason (shown by pytest -ra).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import ray_agents
import torch
from datasets import concatenate_datasets, load_from_disk

from hf_rollouts import ScriptedAgent
from hf_rollouts.agents import AgentRecipe, load_agent
from hf_rollouts.agents.sampling import SamplingConfig
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.executors import LocalExecutor, RayExecutor, ShardFailedError
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.schema import to_task_dataset
from hf_rollouts.shard_cache import ShardFile

# Before ray is imported (it reads them then): with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 every Ray listener and
# every address it advertises is 127.0.0.1 (node_ip_address alone does not do that on Linux); no usage report.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
os.environ.update(RAY_ENV)
ray = pytest.importorskip("ray", reason="the Ray tests need ray: pip install 'hf_rollouts[ray]'")
SCRIPT = ["1 2 3 4", "2"]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each on 127.0.0.1, in a temp dir of their own; this process connected as driver."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    if ray_constants.ENABLE_RAY_CLUSTER:  # ray was imported before this module set the variable
        pytest.skip("ray was imported with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER unset: it would not stay on 127.0.0.1")
    saved = os.environ.get("RAY_TMPDIR")
    tmp = tempfile.mkdtemp(prefix="hfr-ray-")  # short: Ray's unix socket paths must stay under 108 bytes
    os.environ["RAY_TMPDIR"] = tmp  # this cluster's sessions, logs and address file, apart from any other Ray
    ray.cloudpickle.register_pickle_by_value(ray_agents)  # workers cannot import tests/
    started, nodes, skip = time.perf_counter(), None, None
    try:
        nodes = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
        )
        nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        if not nodes.address.startswith("127.0.0.1:"):
            skip = f"the local Ray cluster advertises {nodes.address}, not a loopback address"
        else:
            ray.init(address=nodes.address, log_to_driver=False)
    except Exception as exc:  # never silently: the reason is in pytest's summary (-ra)
        skip = f"Ray could not start a local 2-node cluster here: {type(exc).__name__}: {exc}"
    try:
        if skip is None:
            print(f"\n2-node Ray cluster on {nodes.address} up in {time.perf_counter() - started:.1f} s")
            yield nodes
    finally:
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()  # stops exactly the processes this cluster started (never `ray stop`)
        ray.cloudpickle.unregister_pickle_by_value(ray_agents)
        os.environ.pop("RAY_TMPDIR") if saved is None else os.environ.__setitem__("RAY_TMPDIR", saved)
        shutil.rmtree(tmp, ignore_errors=True)
    if skip is not None:
        pytest.skip(skip)


EXACT = {"third": 1 / 3, "tiny": 1e-300, "neg_zero": -0.0, "big": 2**70, "nested": [{"é": None}, {}], "u": "☃"}
"""Task values that must cross to the workers and back exactly (issue 41, item 4): floats to the bit, any int."""


@pytest.fixture()
def tasks(tokenizer):
    a = MastermindEnv(tokenizer, {"max_turns": 3}).get_train_dataset(3)
    a = to_task_dataset([{**r, "task_data": {**json.loads(r["task_data"]), "exact": EXACT}} for r in a])
    b = GuessNumberEnv(tokenizer, {"max_turns": 2, "high": 4}).get_train_dataset(3)
    return concatenate_datasets([a, b])


@pytest.fixture()
def commits(monkeypatch):
    """Shard indices in the order this (driver) process wrote them."""
    written: list[int] = []
    write = ShardFile.write

    def counting(self, table):
        written.append(self.index)
        write(self, table)

    monkeypatch.setattr(ShardFile, "write", counting)
    return written


def run(tasks, agent, cache, executor, **kw):
    kw.setdefault("num_rollouts", 2)
    return generate_rollouts(
        tasks, agent, batch_size=2, shard_size=2, cache_dir=cache, progress=False, executor=executor, **kw
    )


def test_ray_equals_local_and_runs_resume_across_executors(cluster, tasks, tmp_path, commits):
    agent = load_agent("tiny", SamplingConfig(temperature=1.0, max_new_tokens=8))  # records its recipe
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each 1-CPU Ray worker: the same float summation order, so identical log-probs
    try:
        local = run(tasks, agent, tmp_path / "local", LocalExecutor())
    finally:
        torch.set_num_threads(threads)
    commits.clear()
    executor = RayExecutor(num_workers=2)
    remote = run(tasks, agent, tmp_path / "ray", executor)
    assert remote.features == local.features
    assert [repr(json.loads(t)["exact"]) for t in remote["task_data"][:3]] == [repr(EXACT)] * 3
    for column in local.column_names:
        assert remote[column] == local[column], column
    report = executor.report
    assert sorted(report.expanded) == [0, 1, 2] and sorted(commits) == [0, 1, 2]  # each shard committed once
    # a worker still building its agent when the last shard is committed is stopped, so 1 or 2 report in
    assert 1 <= len(report.workers) <= 2 and all(w["startup_s"] >= w["agent_build_s"] for w in report.workers)
    names = sorted(p.name for p in (tmp_path / "local").glob("*.arrow"))
    assert names == sorted(p.name for p in (tmp_path / "ray").glob("*.arrow"))  # the same fingerprint and files
    # started locally, finished on Ray: only the missing shard is expanded
    (tmp_path / "local" / names[1]).unlink()
    commits.clear()
    resumed = run(tasks, agent, tmp_path / "local", executor)
    assert executor.report.expanded == [1] and executor.report.reused == [0, 2] and commits == [1]
    assert resumed.to_list() == local.to_list()


def test_ray_rows_equal_local_rows_at_any_thread_count_within_the_stated_tolerance(cluster, tasks, tmp_path):
    """A local run at this process's torch thread count (not the workers' one thread) against a Ray run of 2 workers,
    field by field: every column equal but ``padded_logprobs``, which may differ in the last bits (other reductions)
    and stays within ``verify``'s LOGPROB_TOLERANCE; the Ray run's saved rows verify against the local agent."""
    import numpy as np

    from hf_rollouts.provenance import LOGPROB_TOLERANCE, verify_rollouts
    from hf_rollouts.publish import save_rollouts

    agent = load_agent("tiny", SamplingConfig(temperature=1.0, max_new_tokens=8))
    local = run(tasks, agent, tmp_path / "local", LocalExecutor())
    remote = run(tasks, agent, tmp_path / "ray", RayExecutor(num_workers=2))
    for column in local.column_names:
        if column != "padded_logprobs":
            assert remote[column] == local[column], column
    for a, b in zip(local["padded_logprobs"], remote["padded_logprobs"]):
        for x, y in zip(a, b):
            assert len(x) == len(y) and np.abs(np.array(x) - np.array(y)).max() <= LOGPROB_TOLERANCE
    report = verify_rollouts(save_rollouts(remote, tmp_path / "saved"), agent, sample=len(tasks))
    assert report.exit_code == 0, report.text()


def test_a_killed_worker_loses_only_its_shard(cluster, tasks, tokenizer, tmp_path, commits):
    reference = run(tasks, ScriptedAgent(SCRIPT), tmp_path / "ref", LocalExecutor(), tokenizer=tokenizer)
    commits.clear()
    marker = tmp_path / "markers"
    marker.mkdir()
    kwargs = {"responses": SCRIPT, "delay": 0.15, "marker": str(marker)}
    agent = ray_agents.SlowAgent(**{**kwargs, "marker": None})
    executor = RayExecutor(num_workers=2)
    result: dict = {}

    def drive():
        try:
            result["ds"] = run(
                tasks,
                agent,
                tmp_path / "ray",
                executor,
                tokenizer=tokenizer,
                agent_recipe=AgentRecipe(factory=ray_agents.SlowAgent, kwargs=kwargs),
            )
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    driver = threading.Thread(target=drive)
    driver.start()
    deadline = time.monotonic() + 120
    while not list(marker.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = int(next(marker.iterdir()).name)  # a worker that is playing its first shard
    os.kill(victim, signal.SIGKILL)
    driver.join(timeout=300)
    assert "error" not in result, result.get("error")
    assert result["ds"].to_list() == reference.to_list()
    assert sorted(commits) == [0, 1, 2]  # each shard committed exactly once, the killed one included
    (lost,) = executor.report.retried.values()
    assert len(lost) == 1 and "worker died" in lost[0]
    assert victim in [w["pid"] for w in executor.report.workers] and len(executor.report.workers) >= 2
    retried = dict(executor.report.rows())["shards retried"]  # what the CLI prints and the card keeps
    assert retried.startswith(f"1 (shard {next(iter(executor.report.retried))}: its worker died")
    from hf_rollouts.publish import render_card

    card = str(render_card(result["ds"], agent_info={}, seed=0, pad_token_id=0, executor_report=executor.report))
    assert "| executor | ray |" in card and f"| shards retried | {retried}" in card
    print(f"killed worker {victim}: shard {list(executor.report.retried)} redone; {executor.report}")


def test_a_killed_driver_leaves_finished_shards_a_rerun_does_not_redo(cluster, tasks, tokenizer, tmp_path, commits):
    cache = tmp_path / "cache"
    tasks.save_to_disk(str(tmp_path / "tasks"))
    script = textwrap.dedent(
        f"""
        import ray, ray_agents
        from datasets import load_from_disk
        from hf_rollouts.agents import AgentRecipe
        from hf_rollouts.executors import RayExecutor
        from hf_rollouts.pipeline import generate_rollouts
        from hf_rollouts.tiny_model import build_tokenizer
        ray.init(address={cluster.address!r}, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(ray_agents)
        kwargs = {{"responses": {SCRIPT!r}, "delay": 0.3}}
        generate_rollouts(load_from_disk({str(tmp_path / "tasks")!r}), ray_agents.SlowAgent(**kwargs), 2,
                          tokenizer=build_tokenizer(), batch_size=2, shard_size=2, cache_dir={str(cache)!r},
                          progress=False, executor=RayExecutor(num_workers=1),
                          agent_recipe=AgentRecipe(factory=ray_agents.SlowAgent, kwargs=kwargs))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not list(cache.glob("*-shard*.arrow")) and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)  # mid-run: one shard written, the next in flight on the worker
    _, stderr = driver.communicate(timeout=60)
    done = sorted(int(p.name.split("-shard")[1][:5]) for p in cache.glob("*-shard*.arrow"))
    assert done and len(done) < 3, stderr[-3000:]
    assert not list(cache.glob("*.tmp"))  # no half-written file left behind
    executor = LocalExecutor()  # the same run (the same task dataset: it is in the cache key), finished locally
    tasks = load_from_disk(str(tmp_path / "tasks"))
    agent = ScriptedAgent(SCRIPT)
    resumed = run(tasks, agent, cache, executor, tokenizer=tokenizer)
    missing = [i for i in range(3) if i not in done]
    assert executor.report.reused == done and executor.report.expanded == missing and commits == missing
    full = ScriptedAgent(SCRIPT)
    reference = run(tasks, full, tmp_path / "ref", LocalExecutor(), tokenizer=tokenizer)
    assert resumed.to_list() == reference.to_list()
    assert 0 < agent.calls < full.calls  # the finished shards were not played again
    print(f"driver killed with shards {done} written; the local rerun expanded {missing}, {agent.calls} agent calls")


@pytest.mark.parametrize("failure", ["crash", "hang"])
def test_a_shard_that_keeps_failing_stops_the_run_naming_it(cluster, tasks, tokenizer, tmp_path, failure):
    kwargs = {"responses": SCRIPT, failure: True}
    executor = RayExecutor(num_workers=1, max_shard_retries=1, shard_timeout=2.0)
    with pytest.raises(ShardFailedError, match=r"shard 0 of 1 \(task rows \[0, 2\).*failed 2 times") as info:
        run(
            tasks.select(range(2)),
            ray_agents.SlowAgent(SCRIPT),
            tmp_path,
            executor,
            tokenizer=tokenizer,
            agent_recipe=AgentRecipe(factory=ray_agents.SlowAgent, kwargs=kwargs),
        )
    assert ("worker died" if failure == "crash" else "shard_timeout=2 s") in str(info.value)
    assert not list(tmp_path.glob("*-shard*.arrow"))
    print(f"{failure}: {info.value}")


def test_a_worker_whose_agent_differs_is_refused(cluster, tasks, tokenizer, tmp_path):
    other = AgentRecipe(factory=ScriptedAgent, kwargs={"responses": ["4 3 2 1"]})
    with pytest.raises(ValueError, match=r"not the driver's \(agent differ"):
        run(tasks, ScriptedAgent(SCRIPT), tmp_path, RayExecutor(num_workers=1), tokenizer=tokenizer, agent_recipe=other)
    with pytest.raises(ValueError, match="no recipe"):  # refused before any worker starts
        run(tasks, ScriptedAgent(SCRIPT), tmp_path, "ray", tokenizer=tokenizer)


def test_cli_executor_ray(cluster, tmp_path):
    import numpy as np

    from hf_rollouts.cli import main

    args = ["generate", "--env", "mastermind", "--num-tasks", "4", "--num-rollouts", "2", "--env-config",
            '{"max_turns": 2}', "--max-new-tokens", "8", "--shard-size", "2", "--batch-size", "2"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "local"), "--cache-dir", str(tmp_path / "c1")]) == 0
    ray_args = ["--executor", "ray", "--ray-address", cluster.address, "--num-workers", "2", "--shard-timeout", "300"]
    assert main([*args, *ray_args, "--output", str(tmp_path / "ray"), "--cache-dir", str(tmp_path / "c2")]) == 0
    local, remote = load_from_disk(str(tmp_path / "local")), load_from_disk(str(tmp_path / "ray"))
    assert remote.remove_columns("padded_logprobs").to_list() == local.remove_columns("padded_logprobs").to_list()
    for a, b in zip(local["padded_logprobs"], remote["padded_logprobs"]):  # float summation order: thread counts
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


def test_the_ray_driver_never_loads_the_model(cluster, tmp_path, monkeypatch):
    """With --executor ray the driver reads the model's fingerprint from its files (same cache key as a run that
    loaded it) and only the workers load it."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.cli import main

    args = ["generate", "--env", "guess_number", "--num-tasks", "3", "--num-rollouts", "2", "--env-config",
            '{"max_turns": 2}', "--max-new-tokens", "6", "--shard-size", "2", "--batch-size", "2"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "local"), "--cache-dir", str(tmp_path / "c1")]) == 0

    def refuse(*_, **__):
        raise AssertionError("the Ray driver loaded the model")

    monkeypatch.setattr(TransformersAgent, "__init__", refuse)  # this process only: the workers are others
    ray_args = ["--executor", "ray", "--ray-address", cluster.address, "--num-workers", "2"]
    assert main([*args, *ray_args, "--output", str(tmp_path / "ray"), "--cache-dir", str(tmp_path / "c2")]) == 0
    names = sorted(p.name for p in (tmp_path / "c1").glob("*.arrow"))
    assert names and names == sorted(p.name for p in (tmp_path / "c2").glob("*.arrow"))  # the same cache key
    local, remote = load_from_disk(str(tmp_path / "local")), load_from_disk(str(tmp_path / "ray"))
    assert remote.remove_columns("padded_logprobs").to_list() == local.remove_columns("padded_logprobs").to_list()
