"""Every option the planner models, declared once.

Each field of :class:`ServingOptions` (a ``vllm serve`` option whose memory or layout the
planner models) and of :class:`PlannerOptions` (what only the planner reads) carries its
type (the annotation), default, bounds or choices, scope, the ``vllm serve`` flag it renders
to, the ``vllm-fleet`` flag, its help and how the memory model uses it. From that one
declaration come:

* the inventory variables ``vllm_fleet_<name>`` and their checks (interface.VARIABLES);
* the ``vllm-fleet estimate`` / ``plan`` flags (cli.py);
* the wishes the ``vllm_fleet_plan`` filter accepts and the planner's ``Wishes`` (strategy.py,
  a subclass of PlannerOptions) and ``Settings`` (accounting/settings.py, a subclass of
  ServingOptions);
* the ``vllm serve`` arguments the plan renders (:func:`serve_args`);
* the README's inventory table and the errors' field names (:func:`inventory_field`).

To add an option: one field here (and, where it changes memory, the accounting that reads it).
vLLM's own config dataclasses feeding its argparse (vllm/config/, engine/arg_utils.py) are
the pattern.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from vllm_fleet.accounting.base import ALL2ALL_BACKENDS, CURRENT_VLLM, DEFAULT_ALL2ALL_BACKEND

PREFIX = "vllm_fleet_"

# Upper bounds that keep the planner's loops and arithmetic small (a typo or a hostile
# input answers in milliseconds with the field named, never a hang).
LIMITS: dict[str, int] = {
    "tensor_parallel_size": 1024,
    "pipeline_parallel_size": 1024,
    "data_parallel_size": 1024,
    "max_model_len": 10**8,
    "max_num_seqs": 1 << 20,
    "max_num_batched_tokens": 10**8,
    "block_size": 1 << 16,
    "target_concurrency": 10**9,
}
MAX_GPU_MEMORY_GIB = 4096.0
# vLLM's LoRAConfig.max_lora_rank (MaxLoRARanks) and lora_dtype (LoRADType).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_DTYPES = ("auto", "float16", "bfloat16")
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")


@dataclass(frozen=True)
class Option:
    """How one field is an option (the field's annotation is its type, its default the default)."""

    flag: str | None  # the vllm serve flag it renders to; None: not a vllm serve flag
    help: str
    memory: str = ""  # how the memory model uses it ("" : it does not change memory)
    cli: str | None = None  # the vllm-fleet flag (default: flag)
    short: tuple[str, ...] = ()  # short CLI aliases (-tp)
    scope: str = "all"  # as interface.Var: all, node, all/node
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    # value: rendered when not the default; planned: the planner renders the value it chose
    # (render.vllm_args); none: not rendered.
    render: str = "value"
    requires: str = ""  # a boolean option that must be on for this one to render
    always: bool = False  # rendered whenever ``requires`` is on, at its default too
    multimodal: bool = False  # rendered for multimodal models only
    json_key: str = ""  # the flag takes a JSON object; this option is the value of this key
    commands: tuple[str, ...] = ("estimate", "plan")  # vllm-fleet commands with the flag
    # With vllm_fleet_models, each model's own (the deployment-wide value does not apply to it).
    per_model: bool = False
    # One value for the whole deployment (one vLLM release, one way to span nodes): never a key of
    # a vllm_fleet_models entry.
    deployment: bool = False
    metavar: str | None = None


def opt(default: Any, flag: str | None, help: str, **how: Any) -> Any:
    """A dataclass field that is an option (see :class:`Option`)."""
    return field(default=default, metadata={"option": Option(flag, help, **how)})


@dataclass(frozen=True)
class ServingOptions:
    """The ``vllm serve`` options the planner models, with vLLM's defaults; None where the
    planner decides (the layout, the context length) or vLLM's default applies."""

    # The layout: the planner chooses these unless the operator forces them.
    max_model_len: int | None = opt(
        None,
        "--max-model-len",
        "context length (default: vLLM's, lowered to what fits)",
        render="planned",
        minimum=1,
        maximum=LIMITS["max_model_len"],
        memory="activations, the KV a request needs",
    )
    gpu_memory_utilization: float | None = opt(
        None,
        "--gpu-memory-utilization",
        "GPU memory share vLLM may use (vLLM's default: 0.92 from 0.20, 0.9 before)",
        render="planned",
        minimum=0.01,
        maximum=1.0,
        memory="the budget: total x utilization",
    )
    tensor_parallel_size: int | None = opt(
        None,
        "--tensor-parallel-size",
        "force TP",
        short=("-tp",),
        render="planned",
        minimum=1,
        maximum=LIMITS["tensor_parallel_size"],
        memory="weights and KV heads per GPU",
        per_model=True,
    )
    pipeline_parallel_size: int | None = opt(
        None,
        "--pipeline-parallel-size",
        "force PP",
        short=("-pp",),
        render="planned",
        minimum=1,
        maximum=LIMITS["pipeline_parallel_size"],
        memory="layers per stage",
        per_model=True,
    )
    data_parallel_size: int | None = opt(
        None,
        "--data-parallel-size",
        "force DP ranks (dense models: TP=1 copies behind one server)",
        short=("-dp",),
        render="planned",
        minimum=1,
        maximum=LIMITS["data_parallel_size"],
        memory="one copy per rank",
        per_model=True,
    )
    max_num_seqs: int | None = opt(
        None,
        "--max-num-seqs",
        "sequences in one batch (default: vLLM's)",
        render="planned",
        minimum=1,
        maximum=LIMITS["max_num_seqs"],
        memory="sampler and CUDA graph sizes",
    )
    # Precision
    # The plan renders the dtype it planned with (a float16 checkpoint: --dtype float16), not "auto".
    dtype: str = opt(
        "auto", "--dtype", "weights dtype", choices=DTYPES[:5], render="planned", memory="bytes per weight"
    )
    quantization: str | None = opt(
        None,
        "--quantization",
        "weights quantization (fp8, awq, gptq, compressed-tensors, mxfp4, ...; default: the checkpoint's)",
        memory="bytes per weight, as vLLM resolves the method",
        per_model=True,
    )
    kv_cache_dtype: str = opt(
        "auto",
        "--kv-cache-dtype",
        "KV cache dtype",
        choices=KV_CACHE_DTYPES[:4],
        memory="bytes per KV element",
    )
    enforce_eager: bool = opt(False, "--enforce-eager", "no CUDA graphs", memory="no CUDA graph pool")
    # Multimodal models (multimodal.py): rendered for them only.
    limit_mm_per_prompt: dict[str, Any] | None = opt(
        None,
        "--limit-mm-per-prompt",
        "items per prompt by modality, e.g. {image: 2, video: 0}; 0 for every modality: text only, no tower",
        multimodal=True,
        metavar="JSON",
        memory="the encoder profile and cache",
    )
    language_model_only: bool = opt(
        False,
        "--language-model-only",
        "serve the language model alone: every modality's limit 0, no tower built or profiled",
        multimodal=True,
        memory="the towers' weights and encoder profile",
    )
    mm_max_pixels: int | None = opt(
        None,
        "--mm-processor-kwargs",
        "max_pixels of the image processor (Qwen-VL)",
        json_key="max_pixels",
        multimodal=True,
        minimum=1,
        maximum=1 << 36,
        metavar="JSON",
        memory="the encoder profile's largest image",
    )
    skip_mm_profiling: bool = opt(
        False,
        "--skip-mm-profiling",
        "no encoder profile pass",
        multimodal=True,
        memory="no encoder profile peak",
    )
    mm_encoder_tp_mode: str = opt(
        "weights",
        "--mm-encoder-tp-mode",
        "the vision tower's TP: weights (sharded) or data (replicated)",
        choices=("weights", "data"),
        multimodal=True,
        memory="the tower's weights per GPU",
    )
    # LoRA (vllm_fleet/accounting/options.py): rendered with --enable-lora only.
    enable_lora: bool = opt(False, "--enable-lora", "serve LoRA adapters", memory="A/B slots on every wrapped layer")
    max_loras: int = opt(
        1,
        "--max-loras",
        "adapters in one batch",
        requires="enable_lora",
        always=True,
        minimum=1,
        maximum=1 << 12,
        memory="slots per layer",
    )
    max_lora_rank: int = opt(
        16,
        "--max-lora-rank",
        "the largest adapter rank",
        requires="enable_lora",
        always=True,
        choices=LORA_RANKS,
        metavar="RANK",
        memory="slot size",
    )
    max_cpu_loras: int | None = opt(
        None,
        "--max-cpu-loras",
        "adapters cached in CPU memory (default: max_loras)",
        requires="enable_lora",
        minimum=1,
        maximum=1 << 16,
    )
    lora_dtype: str = opt(
        "auto",
        "--lora-dtype",
        "the slots' dtype",
        requires="enable_lora",
        choices=LORA_DTYPES,
        memory="slot bytes",
    )
    fully_sharded_loras: bool = opt(
        False,
        "--fully-sharded-loras",
        "shard the slots over TP too",
        requires="enable_lora",
        memory="slots per GPU",
    )
    speculative_config: dict[str, Any] | None = opt(
        None,
        "--speculative-config",
        "speculative decoding, e.g. {method: ngram, num_speculative_tokens: 3, "
        "prompt_lookup_max: 3}, {method: mtp} or {method: eagle3, model: <draft>, num_speculative_tokens: 3}",
        metavar="JSON",
        memory="the draft's weights and KV layers, larger CUDA graph batches",
        per_model=True,
    )
    cpu_offload_gb: float = opt(
        0.0,
        "--cpu-offload-gb",
        "weights per GPU moved to CPU memory, GiB",
        minimum=0,
        maximum=1 << 20,
        memory="decoder-layer weights leave the GPU",
    )
    # Scheduling and the KV pool
    max_num_batched_tokens: int | None = opt(
        None,
        "--max-num-batched-tokens",
        "tokens in one scheduler step (default: vLLM's)",
        minimum=1,
        maximum=LIMITS["max_num_batched_tokens"],
        memory="the profile pass's activations",
    )
    block_size: int | None = opt(
        None,
        "--block-size",
        "tokens per KV block (default: the attention backend's)",
        minimum=1,
        maximum=LIMITS["block_size"],
        memory="KV blocks and their rounding",
    )
    enable_prefix_caching: bool | None = opt(
        None,
        "--enable-prefix-caching",
        "--enable-/--no-enable-prefix-caching (unset: vLLM's default)",
        memory="none of its own (cached blocks are the KV pool's)",
    )
    # Expert parallelism (ParallelConfig); the planner chooses EP itself (dp_ep).
    enable_eplb: bool = opt(False, "--enable-eplb", "expert-parallel load balancing", memory="EPLB's buffers")
    num_redundant_experts: int = opt(
        0,
        "--eplb-config",
        "redundant experts per EP group (with enable_eplb)",
        json_key="num_redundant_experts",
        minimum=0,
        maximum=1 << 16,
        metavar="JSON",
        memory="experts per GPU",
    )
    all2all_backend: str = opt(
        DEFAULT_ALL2ALL_BACKEND,
        "--all2all-backend",
        "MoE all2all backend under DP x EP",
        choices=tuple(sorted(ALL2ALL_BACKENDS)),
        metavar="BACKEND",
        memory="the dispatch buffers",
    )
    # The vLLM release that runs (image tag, venv pin, the accounting).
    vllm_version: str = opt(
        CURRENT_VLLM,
        None,
        "the vLLM release everywhere: image tag, venv pin, accounting",
        render="none",
        cli="--vllm-version",
        deployment=True,
    )


@dataclass(frozen=True)
class PlannerOptions(ServingOptions):
    """What only the planner reads (strategy.Wishes adds what the deployment hands it)."""

    allow_cross_node_tp: bool = opt(
        False,
        None,
        "allow TP across nodes (else PP across nodes)",
        render="none",
        cli="--allow-cross-node-tp",
        commands=("plan",),
        deployment=True,
    )
    target_concurrency: int | None = opt(
        None,
        None,
        "requests at max_model_len the layout should hold",
        render="none",
        cli="--target-concurrency",
        minimum=1,
        maximum=LIMITS["target_concurrency"],
        commands=("plan",),
        per_model=True,
    )
    multinode_backend: str = opt(
        "auto", None, "auto, ray or native: how multi-node instances run (auto: native unless Ray is available "
        "or nodes are uneven)", render="none", cli="--multinode-backend", choices=("auto", "ray", "native"),
        commands=("plan",), deployment=True,
    )  # fmt: skip
    # The performance model's inputs (vllm_fleet/performance/workload.py declares each key, its
    # CLI flag and check); the CLI takes them as flags (--input-len, --slo-tpot-ms...).
    workload: dict[str, Any] | None = opt(
        None,
        None,
        "the workload the layout is chosen for, for the whole cluster: {input_len, output_len, "
        "concurrency or request_rate, num_prompts, prefix_hit, range_ratio, chat_lengths} (default: 1,024 in / 256 "
        "out; the plan states it)",
        render="none",
        commands=(),
        per_model=True,
        metavar="MAPPING",
    )
    calibration: dict[str, Any] | None = opt(
        None,
        None,
        "this cluster's own speed against the performance model: {step_time, ttft}, factors on the "
        "predicted step time and time to first token, as `vllm-fleet calibrate artifacts/verify.json` prints "
        "them after a run",
        render="none",
        cli="--calibration",
        commands=("plan",),
        deployment=True,
        metavar="JSON",
    )
    slo: dict[str, Any] | None = opt(
        None,
        None,
        "the service level the layout must meet: {ttft_p90_ms, tpot_p90_ms}; layouts are ranked by "
        "the requests/s meeting it (default: TPOT p90 <= 50 ms and TTFT p90 <= 2 s, stated in the plan)",
        render="none",
        commands=(),
        per_model=True,
        metavar="MAPPING",
    )


@dataclass(frozen=True)
class Declared:
    """One option as the rest of the planner uses it."""

    name: str
    kind: str  # bool, int, float, str, choice, json
    default: Any
    option: Option
    optional: bool  # None is a value (bool: --x / --no-x / unset)

    @property
    def inventory(self) -> str:
        return PREFIX + self.name

    @property
    def cli(self) -> str | None:
        return self.option.cli or self.option.flag


def _kind(hint: Any, option: Option) -> tuple[str, bool]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    optional = type(None) in args
    base = next(a for a in args if a is not type(None))
    origin = typing.get_origin(base) or base
    if origin is bool:
        return "bool", optional
    if origin in (int, float):
        return origin.__name__, optional
    if origin in (dict, Mapping):
        return "json", optional
    return ("choice" if option.choices else "str"), optional


@functools.cache
def declared() -> tuple[Declared, ...]:
    """Every option, in declaration order (the order the plan renders them in)."""
    hints = typing.get_type_hints(PlannerOptions)
    out = []
    for f in fields(PlannerOptions):
        option = f.metadata.get("option")
        if option is None:
            continue
        kind, optional = _kind(hints[f.name], option)
        default = None if f.default is MISSING else f.default
        out.append(Declared(f.name, kind, default, option, optional))
    return tuple(out)


@functools.cache
def by_name() -> dict[str, Declared]:
    return {d.name: d for d in declared()}


def serving_names() -> tuple[str, ...]:
    """The options Settings and Wishes share (ServingOptions' fields)."""
    return tuple(f.name for f in fields(ServingOptions))


def values_of(obj: ServingOptions) -> dict[str, Any]:
    """ServingOptions' fields of ``obj`` (a Wishes or a Settings)."""
    return {name: getattr(obj, name) for name in serving_names()}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))
    return str(value)


def serve_args(obj: ServingOptions, multimodal: bool) -> list[str]:
    """The ``vllm serve`` flags of ``obj``'s options, in declaration order: each one not at
    its default (``requires``: only with that option on; ``always``: then at its default too;
    ``multimodal``: for multimodal models only). The planned ones (TP, PP, the context length...)
    are render.vllm_args' own."""
    args: list[str] = []
    for d in declared():
        how = d.option
        if how.render != "value" or how.flag is None or not hasattr(obj, d.name):
            continue
        value = getattr(obj, d.name)
        if how.multimodal and not multimodal:
            continue
        if how.requires and not getattr(obj, how.requires):
            continue
        if value is None or (value == d.default and not (how.always and how.requires)):
            continue
        if d.kind == "bool":
            args.append(how.flag if value else "--no-" + how.flag.removeprefix("--"))
            continue
        shown = {how.json_key: value} if how.json_key else value
        args += [how.flag, _text(shown)]
    return args


# Names that are not options here but appear in errors (the field of a PlanError is the CLI
# flag or the bare name; an Ansible run shows the inventory variable).
_OTHER_NAMES: tuple[tuple[str, str, str], ...] = (
    ("model", "--model", "vllm_fleet_model"),
    ("extra_env", "--env", "vllm_fleet_extra_env"),
    ("allow_deprecated_quantization", "--allow-deprecated-quantization",
     "'--allow-deprecated-quantization' in vllm_fleet_extra_args"),
)  # fmt: skip


@functools.cache
def names() -> tuple[tuple[str, str, str], ...]:
    """(bare name, CLI flag, inventory variable) of every option and of the few other fields
    errors name."""
    out = [(d.name, d.cli, d.inventory) for d in declared() if d.cli and d.option.json_key == ""]
    out += [(d.name, d.cli, d.inventory) for d in declared() if d.cli and d.option.json_key]
    return (*((a, str(b), c) for a, b, c in out), *_OTHER_NAMES)
