"""The shard plan and the executors' shared contract, without Ray: one plan for every executor, skip-completed,
process blocks, options routed to the right place, and a clear error when Ray workers would have no recipe."""

from __future__ import annotations

import pytest
from datasets import concatenate_datasets

from hf_rollouts import ScriptedAgent
from hf_rollouts.agents import AgentRecipe
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.executors import ExecutorOptions, LocalExecutor, ProcessesExecutor, RayExecutor, plan_shards
from hf_rollouts.pipeline import generate_rollouts


@pytest.fixture()
def tasks(tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    return concatenate_datasets([env.get_train_dataset(3), env.get_eval_dataset(2)])


def test_plan_names_fixed_contiguous_shards(tmp_path):
    plan = plan_shards(tmp_path, "abc", num_tasks=5, shard_size=2)
    assert [(s.start, s.stop) for s in plan.shards] == [(0, 2), (2, 4), (4, 5)]
    assert [s.path.name for s in plan.shards][0] == "abc-shard00000-of00003.arrow"
    assert [list(plan.block(r, 2)) for r in range(2)] == [[0, 1], [2]]
    assert [list(plan.block(r, 4)) for r in range(4)] == [[0], [1], [2], []]
    assert plan.pending(range(3), reuse=True) == [0, 1, 2]  # nothing written yet


def test_every_local_executor_writes_the_same_files_and_skips_completed(tasks, tokenizer, tmp_path):
    def run(executor, cache):
        return generate_rollouts(
            tasks, ScriptedAgent(["1 2 3 4"]), 2, tokenizer=tokenizer, shard_size=2, batch_size=2,
            cache_dir=cache, progress=False, executor=executor,
        )  # fmt: skip

    local, processes = LocalExecutor(), ProcessesExecutor()
    a = run(local, tmp_path / "a")
    b = run(processes, tmp_path / "b")  # one process: its block is every shard
    assert a.to_list() == b.to_list()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert local.report.expanded == processes.report.expanded == [0, 1, 2]
    next(iter(sorted((tmp_path / "a").glob("*shard00001*")))).unlink()
    again = run(local, tmp_path / "a")
    assert local.report.expanded == [1] and local.report.reused == [0, 2]
    assert again.to_list() == a.to_list()


def test_options_go_to_the_run_or_the_executor(tasks, tokenizer, tmp_path):
    agent = ScriptedAgent(["1"])
    kw = {"tokenizer": tokenizer, "cache_dir": tmp_path, "progress": False}
    with pytest.raises(TypeError, match="unknown option.*'num_worker'"):
        generate_rollouts(tasks, agent, 1, num_worker=2, **kw)
    with pytest.raises(TypeError, match="set them on it"):
        generate_rollouts(tasks, agent, 1, executor=RayExecutor(), num_workers=2, **kw)
    with pytest.raises(ValueError, match="executor must be one of"):
        generate_rollouts(tasks, agent, 1, executor="slurm", **kw)
    with pytest.raises(ValueError, match="max_shard_retries"):
        ExecutorOptions(executor="ray", max_shard_retries=-1)
    # Ray workers build their agent from a recipe: none at all is refused before Ray is even imported
    with pytest.raises(ValueError, match=r"no recipe for this ScriptedAgent.*load_agent"):
        generate_rollouts(tasks, agent, 1, executor="ray", num_workers=2, **kw)
    with pytest.raises(ValueError, match="exactly one of spec= .* and factory="):
        AgentRecipe()
    assert agent.calls == 0


# -- an agent given as its recipe: fingerprinted from its files, built only where shards run -------------------
def test_a_recipe_fingerprint_read_from_the_files_equals_the_loaded_agents(tmp_path):
    import torch

    from hf_rollouts.agents import SamplingConfig, load_agent
    from hf_rollouts.tiny_model import build_tiny_model

    sampling = SamplingConfig(temperature=0.7, top_k=5, max_new_tokens=5)
    for kwargs in [
        {},
        {"sampling": SamplingConfig(temperature=0.7, max_new_tokens=5), "seed": 3, "backend": "continuous"},
        {"sampling": sampling, "cache": "static"},  # a forced cache is recorded, and static keeps no KV
        {"sampling": sampling, "cache": "dynamic", "reuse_kv": False},
    ]:
        agent = load_agent("tiny", **kwargs)
        assert agent.recipe.fingerprint() == agent.fingerprint()
    assert load_agent("tiny", cache="static").fingerprint() != load_agent("tiny").fingerprint()
    model, tokenizer = build_tiny_model(seed=1)
    for dtype in (torch.bfloat16, torch.float32):  # a local folder, sharded, loaded with dtype="auto"
        folder = tmp_path / str(dtype)
        model.to(dtype).save_pretrained(folder, max_shard_size="100KB")
        tokenizer.save_pretrained(folder)
        agent = load_agent(str(folder), reuse_kv=False)
        assert len(list(folder.glob("*.safetensors"))) > 1
        assert agent.recipe.fingerprint() == agent.fingerprint()
        assert agent.recipe.load_tokenizer().get_vocab() == agent.tokenizer.get_vocab()
    (folder / "model.safetensors.index.json").unlink()  # weights it cannot read: only building tells
    assert AgentRecipe(spec=str(folder)).fingerprint() is None
    assert AgentRecipe(factory=ScriptedAgent, kwargs={"responses": ["1"]}).fingerprint() is None
    assert AgentRecipe(spec="openai:http://127.0.0.1:9/v1#m").fingerprint() is None


def test_a_recipe_runs_like_its_agent_and_is_built_only_where_shards_run(tasks, tmp_path, monkeypatch):
    from hf_rollouts.agents import SamplingConfig, load_agent
    from hf_rollouts.agents.loading import AgentRecipe as Recipe

    agent = load_agent("tiny", SamplingConfig(temperature=1.0, max_new_tokens=6))
    kw = {"shard_size": 2, "batch_size": 2, "progress": False, "executor": LocalExecutor()}
    loaded = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path / "a", **kw)
    built = []
    build = Recipe.build
    monkeypatch.setattr(Recipe, "build", lambda self: built.append(1) or build(self))
    recipe = agent.recipe
    from_recipe = generate_rollouts(tasks, recipe, 2, cache_dir=tmp_path / "b", **kw)
    assert from_recipe.to_list() == loaded.to_list()
    names = sorted(p.name for p in (tmp_path / "a").glob("*.arrow"))
    assert names == sorted(p.name for p in (tmp_path / "b").glob("*.arrow"))  # the same cache key
    assert built == [1]  # once, by the shard task, when the first shard ran
    built.clear()
    generate_rollouts(tasks, recipe, 2, cache_dir=tmp_path / "b", **kw)
    assert built == []  # every shard reused: the model is never loaded
    # a recipe whose fingerprint is not its agent's is refused where the agent is built, naming what differs
    monkeypatch.setattr(Recipe, "fingerprint", lambda self: {**agent.fingerprint(), "weights_probe": "other"})
    with pytest.raises(ValueError, match=r"not the driver's \(agent differ"):
        generate_rollouts(tasks, recipe, 2, cache_dir=tmp_path / "c", **kw)
