"""Per-GPU memory the way vLLM accounts for it at startup.

vLLM (``Worker.determine_available_memory`` and ``utils/mem_utils.py``):

    requested   = total_gpu_memory x gpu_memory_utilization
    non_kv      = weights + persistent buffers + non-torch increase
                  + transient activation peak of one profile forward pass
    kv_pool     = requested - non_kv - cuda_graph_estimate   (graphs: >= 0.21)
    num_blocks  = kv_pool // (page bytes x layers sharing the pool), then the
                  minimum over all workers (every rank gets the same count)

What the profile pass allocates, and so what this module models:

* weights: parameter bytes per rank (TP shards, PP stages, quantized linear
  weights with their scales, padded vocab, rotary cache, MLA absorbed copies);
* activation peak: the larger of the forward pass over
  ``max_num_batched_tokens`` tokens (MLP / fused-MoE intermediates) and the
  dummy sampler pass over ``max_num_seqs`` rows of full-vocabulary logits;
* non-torch memory: cuBLAS workspaces and, where the snapshot predates
  distributed init (vLLM < 0.12), NCCL / custom all-reduce buffers;
* CUDA graphs: per captured graph and layer, zero with ``enforce_eager``.

GiB are 2**30 bytes. The ``vllm_version`` knob selects the accounting of that
release family (V0 engine, early V1, current) so the planner can be checked
against logs of older releases; plans always use the current accounting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_fleet.errors import PlanError
from vllm_fleet.model_spec import (
    ALLOW_DEPRECATED,
    DTYPE_BYTES,
    ModelSpec,
    QuantChoice,
    QuantSpec,
    quant_file_config,
    quant_flag_matches,
    quant_from_name,
    resolve_quantization,
    supported_quantization,
)

GIB = 1 << 30
MIB = 1 << 20
CURRENT_VLLM = "0.32.0"

# Memory the CUDA context takes on every GPU before vLLM's snapshot (driver,
# kernels of torch / vLLM / FlashInfer loaded lazily): outside the budget but
# it has to be free, or startup fails with "Free memory on device ...".
CUDA_CONTEXT_GIB = 0.6
# Per-graph, per-layer cost of captured CUDA graphs (piecewise + full decode
# graphs share one pool); measured 0.49 GiB for a 28-layer model capturing
# 2 x 51 graphs.
CUDA_GRAPH_MIB_PER_GRAPH_LAYER = 0.17
# Sampler dummy pass bytes per (row x vocab) element beyond the model-dtype
# logits: sort-based top-k/top-p (fp32 logits, sorted copy, int64 indices,
# softmax, cumsum, mask, probabilities, noise) before 0.13; FlashInfer / Triton
# kernels (fp32 logits, probabilities, noise) after.
SAMPLER_BYTES_SORT = 36
SAMPLER_BYTES_FUSED = 12
# Fused-MoE processes tokens in chunks of this size (VLLM_FUSED_MOE_CHUNK_SIZE).
FUSED_MOE_CHUNK = 16 * 1024
VOCAB_PAD = 64


def parse_version(text: str) -> tuple[int, int]:
    """``"0.11.2"`` -> ``(0, 11)``; unknown text means the current release."""
    parts = text.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return parse_version(CURRENT_VLLM)


OLDEST_KNOWN_VLLM = "0.5.0"


def known_release(text: str) -> str | None:
    """None when the planner knows ``text``'s memory accounting, else a warning
    saying which accounting it plans with instead."""
    parts = text.strip().lstrip("v").split(".")
    try:
        rel = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return f"vLLM release {text!r} is not a version; planned with the accounting of {CURRENT_VLLM}"
    if rel > parse_version(CURRENT_VLLM):
        return (
            f"vLLM {text} is newer than the newest accounting the planner knows ({CURRENT_VLLM}); "
            f"planned as {CURRENT_VLLM}: check the KV figures verify reports"
        )
    if rel < parse_version(OLDEST_KNOWN_VLLM):
        return f"vLLM {text} is older than the oldest accounting the planner knows ({OLDEST_KNOWN_VLLM}); planned as it"
    return None


@dataclass(frozen=True)
class Accounting:
    """How a vLLM release family splits memory (see module docstring)."""

    engine: str  # "v0" or "v1"
    nccl_in_budget: bool  # snapshot taken before distributed init
    graphs_in_budget: bool  # CUDA graph estimate subtracted from the KV pool
    sampler_bytes: int
    mla_align_bytes: int  # V0 padded each MLA cache entry to 256 bytes
    mla_absorbed_qo: bool  # 0.7.x V0 MLA kept absorbed W_Q_UK / W_UV_O matrices

    @classmethod
    def for_version(cls, version: str, engine: str | None = None) -> Accounting:
        major, minor = parse_version(version)
        rel = (major, minor)
        eng = (engine or ("v0" if rel < (0, 8) else "v1")).lower()
        return cls(
            engine=eng,
            nccl_in_budget=rel < (0, 12),
            graphs_in_budget=rel >= (0, 21) and eng == "v1",
            sampler_bytes=SAMPLER_BYTES_SORT if rel < (0, 13) else SAMPLER_BYTES_FUSED,
            mla_align_bytes=256 if eng == "v0" else 0,
            mla_absorbed_qo=eng == "v0" and rel == (0, 7),
        )


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


def check_count(value: Any, flag: str, maximum: int, required: bool = False) -> None:
    """A positive integer up to ``maximum`` (None passes unless ``required``); booleans and
    floats are refused (``true`` is not 1)."""
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = f"pass {flag} 1 or more" + ("" if required else ", or omit it")
        raise PlanError(flag, f"must be a positive integer, got {value!r}", fix)
    if value > maximum:
        raise PlanError(
            flag, f"{value:,} is above {maximum:,}, the largest the planner accepts", f"use {maximum:,} or less"
        )


@dataclass
class Settings:
    """The ``vllm serve`` options that change memory, with vLLM's defaults."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    block_size: int | None = None
    layer_partition: list[int] | None = None
    kv_cache_memory_bytes: int | None = None
    vllm_version: str = CURRENT_VLLM
    engine: str | None = None
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE (vllm/envs.py, "1" by default in 0.32):
    # with 0, VllmConfig.__post_init__ turns the hybrid KV cache manager off for models with
    # chunked local attention (Llama 4), and every layer then keeps the whole sequence.
    chunked_local_attn_hybrid_kv: bool = True

    def validate(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            check_count(getattr(self, name), "--" + name.replace("_", "-"), LIMITS[name], required=True)
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
            raise PlanError(
                "--gpu-memory-utilization",
                f"must be in (0, 1], got {util!r}",
                "use a fraction of total GPU memory such as 0.9",
            )
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            check_count(getattr(self, name), "--" + name.replace("_", "-"), LIMITS[name])
        if self.layer_partition is not None and (
            not isinstance(self.layer_partition, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in self.layer_partition)
        ):
            raise PlanError(
                "--layer-partition", f"must be a list of layer counts, got {self.layer_partition!r}", "e.g. 40,40"
            )
        if self.kv_cache_memory_bytes is not None:
            check_count(self.kv_cache_memory_bytes, "--kv-cache-memory-bytes", 1 << 50)
        if self.dtype not in ("auto", "bfloat16", "float16", "float32", "half", "float"):
            raise PlanError("--dtype", f"unknown dtype '{self.dtype}'", "use auto, bfloat16, float16 or float32")
        if self.kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"):
            raise PlanError(
                "--kv-cache-dtype",
                f"unknown KV cache dtype '{self.kv_cache_dtype}'",
                "use auto, fp8, fp8_e4m3 or fp8_e5m2",
            )


@dataclass(frozen=True)
class Device:
    """One GPU (or the CPU) as the planner sees it."""

    name: str
    total_gib: float
    kind: str = "cuda"  # cuda, rocm, cpu
    sm_major: int = 9
    free_gib: float | None = None
    # Compute capability x 10 (75 for a T4); None: sm_major x 10.
    capability: int | None = None

    @property
    def compute_capability(self) -> int:
        return self.capability if self.capability is not None else self.sm_major * 10


# vLLM's QuantizationConfig.get_min_capability() (compute capability x 10) of the class vLLM
# builds for each method (get_quantization_config) once its overrides chose it: below it vLLM
# refuses to start ("The quantization method X is not supported for the current GPU").
QUANT_MIN_CAPABILITY: dict[str, int] = {
    "fp8": 75, "fbgemm_fp8": 80, "fp_quant": 100, "modelopt": 80, "modelopt_fp4": 75, "modelopt_mxfp8": 80,
    "modelopt_mixed": 75, "mxfp8": 80, "mxfp4": 80, "gpt_oss_mxfp4": 80, "awq": 75, "awq_marlin": 75,
    "auto_awq": 75, "gptq": 60, "gptq_marlin": 60, "auto_gptq": 60, "compressed-tensors": 70, "experts_int8": 80,
    "moe_wna16": 70, "torchao": 75, "quark": 70, "inc": 60, "humming": 75, "online": 75, "fp8_per_tensor": 75,
    "fp8_per_block": 75, "fp8_per_channel": 75, "int8_per_channel_weight_only": 75, "nvfp4_per_token": 75,
    "deepseek_v4_fp8": 75,
}  # fmt: skip
# OnlineQuantizationConfig's minimum: what an online shorthand (fp8, mxfp4, mxfp8 without a
# checkpoint config) runs as.
ONLINE_MIN_CAPABILITY = 75


def min_capability(choice: QuantChoice) -> int | None:
    """The compute capability vLLM needs for ``choice`` (None: no minimum known)."""
    if choice.method is None:
        return None
    if choice.online:
        return ONLINE_MIN_CAPABILITY
    return QUANT_MIN_CAPABILITY.get(choice.method)


def vllm_refusal(
    spec: ModelSpec,
    device: Device,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    vllm_version: str = CURRENT_VLLM,
) -> PlanError | None:
    """Why vLLM would refuse to start ``spec`` with these options on ``device``, or None:
    bfloat16 below compute capability 8.0 (``CudaPlatform.check_if_supports_dtype``; with
    ``auto`` vLLM falls back to float16 itself), the quantization vLLM resolves on this device
    (``resolve_quantization``: the checkpoint's method after vLLM's overrides, e.g. ModelOpt
    NVFP4 is modelopt_fp4) below its minimum capability (``VllmConfig._get_quantization_config``),
    and KV cache dtypes no attention backend takes (MLA: no fp8_e5m2 backend on CUDA, and only
    the model dtype on the CPU)."""
    cc = device.compute_capability
    choice = None
    if quantization is None or quantization in supported_quantization(vllm_version) or spec.quant_config is not None:
        try:
            choice = resolve_quantization(
                spec,
                quantization,
                device="cpu" if device.kind == "cpu" else device.kind,
                capability=None if device.kind == "cpu" else cc,
                vllm_version=vllm_version,
                extra_args=(ALLOW_DEPRECATED,),  # the opt-in is checked once, before the GPUs
            )
        except PlanError as err:
            return err
    if device.kind == "cuda":
        if dtype == "bfloat16" and cc < 80:
            return PlanError(
                "--dtype",
                f"bfloat16 needs compute capability 8.0, {device.name} has {cc / 10:.1f} (vLLM refuses it)",
                "use --dtype float16, or auto (vLLM then runs the model in float16 there)",
            )
        need = min_capability(choice) if choice is not None else None
        if choice is not None and need is not None and cc < need:
            method = choice.method
            shown = (
                method if method == quantization or not quantization else f"{method} ({quantization} as vLLM runs it)"
            )
            from_flag = bool(quantization) and choice.source != "quantization_config"
            where = "--quantization" if from_flag else "--model"
            fix = (
                "drop --quantization, or plan GPUs of that capability"
                if from_flag
                else "serve the unquantized (or a GPTQ) checkpoint there, or plan GPUs of that capability"
            )
            return PlanError(
                where,
                f"{shown} weights need compute capability {need / 10:.1f}, {device.name} has {cc / 10:.1f}"
                " (vLLM refuses it)",
                fix,
            )
        if spec.is_mla and kv_cache_dtype == "fp8_e5m2":
            return PlanError(
                "--kv-cache-dtype",
                "fp8_e5m2 has no MLA attention backend in vLLM (MLA models such as DeepSeek)",
                "use --kv-cache-dtype fp8 (e4m3) or auto",
            )
    if device.kind == "cpu" and spec.is_mla and kv_cache_dtype not in ("auto", "bfloat16", "float16"):
        return PlanError(
            "--kv-cache-dtype",
            f"{kv_cache_dtype} is not a KV cache dtype of vLLM's CPU MLA backend (it keeps the model dtype)",
            "use --kv-cache-dtype auto",
        )
    return None


@dataclass
class RankMemory:
    """What one GPU rank holds, in GiB (KV bytes per token in bytes)."""

    rank: int
    pp_stage: int
    tp_rank: int
    layers: list[int]
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    available_kv_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_cache_tokens: int
    num_gpu_blocks: int
    budget_gib: float
    total_gib: float
    startup_overhead_gib: float
    # Named parts of the columns above that only some models or options have, for the table,
    # the JSON and ``estimate``'s explanations: ``<column>.<part>_gib`` for memory already
    # counted in that column (``weights.lora_gib``, ``activation.encoder_profile_gib``) and
    # ``kv.<part>_bytes`` for KV-cache quantities (``kv.ssm_state_bytes_per_seq``).
    parts: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float):
                data[key] = round(value, 4)
        data["parts"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.parts.items()}
        return data


@dataclass
class Estimate:
    """The memory picture of one vLLM instance (all its ranks)."""

    model: str
    device: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    enforce_eager: bool
    layer_partition: list[int]
    ranks: list[RankMemory]
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_fit: int
    fits: bool
    reason: str
    vllm_version: str
    notes: list[str] = field(default_factory=list)
    # One line per model- or option-specific part (the ``parts`` of the ranks): what the
    # planner assumed for it, e.g. "LoRA: 4 adapters x rank 16 buffers on every rank".
    assumptions: list[str] = field(default_factory=list)

    def _worst(self, key: str) -> float:
        return max(float(getattr(r, key)) for r in self.ranks)

    @property
    def weights_gib(self) -> float:
        return self._worst("weights_gib")

    @property
    def kv_cache_gib(self) -> float:
        return min(r.kv_cache_gib for r in self.ranks)

    @property
    def kv_bytes_per_token(self) -> int:
        return int(self._worst("kv_bytes_per_token"))

    def summary(self) -> dict[str, Any]:
        r0 = max(self.ranks, key=lambda r: r.weights_gib + r.activation_gib + r.non_torch_gib)
        return {
            "weights_gib": round(self.weights_gib, 4),
            "activation_gib": round(self._worst("activation_gib"), 4),
            "non_torch_gib": round(self._worst("non_torch_gib"), 4),
            "cuda_graph_gib": round(self._worst("cuda_graph_gib"), 4),
            "kv_cache_gib": round(self.kv_cache_gib, 4),
            "available_kv_gib": round(min(r.available_kv_gib for r in self.ranks), 4),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_cache_tokens,
            "num_gpu_blocks": self.num_gpu_blocks,
            "max_concurrency": round(self.max_concurrency, 2),
            "max_model_len_fit": self.max_model_len_fit,
            "fits": self.fits,
            "budget_gib": round(r0.budget_gib, 4),
            "total_gib": round(r0.total_gib, 4),
            "parts": self.parts(),
        }

    def parts(self) -> dict[str, float]:
        """Every rank's named parts, the largest value of each."""
        found: dict[str, float] = {}
        for r in self.ranks:
            for key, value in r.parts.items():
                found[key] = max(found.get(key, value), value)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in sorted(found.items())}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "device": self.device,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "enable_expert_parallel": self.enable_expert_parallel,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "quantization": self.quantization,
            "enforce_eager": self.enforce_eager,
            "layer_partition": self.layer_partition,
            "vllm_version": self.vllm_version,
        }
        data.update(self.summary())
        data["reason"] = self.reason
        data["notes"] = self.notes
        data["assumptions"] = self.assumptions
        data["ranks"] = [r.to_dict() for r in self.ranks]
        return data


# --------------------------------------------------------------------------
# Layout helpers
# --------------------------------------------------------------------------


def default_partition(num_layers: int, pp: int) -> list[int]:
    """vLLM's default split: layers // pp each, the remainder to the stages
    before the last (``get_pp_indices``)."""
    base, rem = divmod(num_layers, pp)
    parts = [base] * pp
    # vLLM gives the extra layers to the stages just before the last one.
    for i in range(rem):
        parts[pp - 2 - i if pp > 1 else 0] += 1
    return parts


def kv_heads_shard(spec: ModelSpec, tp: int) -> bool:
    """Whether TP shards the KV heads the way vLLM's QKVParallelLinear can: TP divides
    them, or is a multiple of them (each head then replicated); MLA has no KV heads."""
    kv = spec.num_kv_heads
    return spec.is_mla or not kv or kv % tp == 0 or tp % kv == 0


def check_partition(partition: list[int], num_layers: int, pp: int) -> None:
    if len(partition) != pp:
        raise PlanError(
            "layer_partition",
            f"has {len(partition)} entries for pipeline_parallel_size={pp}",
            "give one layer count per pipeline stage",
        )
    if sum(partition) != num_layers or min(partition) < 1:
        raise PlanError(
            "layer_partition",
            f"{partition} must be positive and sum to num_hidden_layers={num_layers}",
            "adjust the counts so they add up to the model's layers",
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _dtype_bytes(spec: ModelSpec, settings: Settings, device: Device) -> float:
    dtype = settings.dtype
    if dtype == "auto":
        dtype = spec.torch_dtype
        if dtype == "float32":
            dtype = "bfloat16"
        if dtype == "bfloat16" and device.kind == "cuda" and device.sm_major < 8:
            dtype = "float16"
    return DTYPE_BYTES.get(dtype, 2)


def _kv_dtype_bytes(settings: Settings, act_bytes: float) -> float:
    if settings.kv_cache_dtype in ("auto", "bfloat16", "float16"):
        return act_bytes
    return 1


def _quant(spec: ModelSpec, settings: Settings) -> QuantSpec | None:
    flag = settings.quantization
    if flag and spec.quant is not None and quant_flag_matches(flag, spec):
        return spec.quant  # vLLM loads the checkpoint's own format (gptq_marlin, moe_wna16, ModelOpt...)
    if flag and spec.quant_config is None:
        try:
            found = quant_file_config(spec, flag)
        except PlanError:
            found = None
        if found is not None:  # the method's own file (quantize_config.json, hf_quant_config.json)
            return quant_from_name(flag, found[1], spec.model_type, where=f"{spec.name.rstrip('/')}/{found[0]}")
    if settings.quantization:
        named = quant_from_name(settings.quantization, None, spec.model_type)
        if spec.quant is not None and named is not None and spec.quant.method == named.method:
            return spec.quant
        return named
    return spec.quant


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


@dataclass
class _Parts:
    embed: float = 0.0
    head: float = 0.0
    layer: float = 0.0
    vision: float = 0.0
    other: float = 0.0

    def total(self) -> float:
        return self.embed + self.head + self.layer + self.vision + self.other


def _linear(n_weights: float, quant: QuantSpec | None, dtype_b: float, expert: bool = False) -> float:
    if quant is None or (quant.experts_only and not expert):
        return n_weights * dtype_b
    return n_weights * quant.bytes_per_weight


def _attention_bytes(spec: ModelSpec, tp: int, quant: QuantSpec | None, db: float, acct: Accounting) -> float:
    h = spec.hidden_size
    heads_r = spec.num_attention_heads / tp
    if spec.is_mla:
        qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        total = 0.0
        if spec.q_lora_rank:
            total += _linear(h * spec.q_lora_rank, quant, db) + spec.q_lora_rank * db
            total += _linear(spec.q_lora_rank * heads_r * qk_head, quant, db)
        else:
            total += _linear(h * heads_r * qk_head, quant, db)
        total += _linear(h * (spec.kv_lora_rank + spec.qk_rope_head_dim), quant, db)
        total += spec.kv_lora_rank * db
        kv_b = spec.kv_lora_rank * heads_r * (spec.qk_nope_head_dim + spec.v_head_dim)
        total += _linear(kv_b, quant, db)
        # vLLM's MLA keeps absorbed W_UK / W_UV copies in the activation dtype.
        total += kv_b * db
        if acct.mla_absorbed_qo:
            # VLLM_MLA_PERFORM_MATRIX_ABSORPTION (0.7.x): W_Q_UK and W_UV_O,
            # re-quantized like the checkpoint.
            q_in = spec.q_lora_rank or h
            absorbed = q_in * heads_r * spec.kv_lora_rank + heads_r * spec.kv_lora_rank * h
            total += _linear(absorbed, quant, db)
        total += _linear(heads_r * spec.v_head_dim * h, quant, db)
        return total
    hd = spec.head_dim
    kv_r = max(1.0, spec.num_kv_heads / tp)
    q_out = heads_r * hd
    kv_out = 2 * kv_r * hd
    total = _linear(h * (q_out + kv_out), quant, db) + _linear(q_out * h, quant, db)
    if spec.attention_bias:
        total += (q_out + kv_out) * db
    if spec.qk_norm:
        total += 2 * hd * db
    if spec.model_type == "gpt_oss":
        total += heads_r * 4  # attention sinks, fp32
    return total


def _mlp_bytes(spec: ModelSpec, index: int, tp: int, ep: int, quant: QuantSpec | None, db: float) -> float:
    h = spec.hidden_size
    if not spec.is_moe_layer(index):
        return _linear(3 * h * spec.intermediate_size / tp, quant, db)
    experts = spec.num_experts
    inter = spec.moe_intermediate_size
    router = h * experts * db  # router, unquantized and replicated
    if quant is not None and quant.method == "mxfp4":
        # vLLM's mxfp4 MoE backends on NVIDIA (Marlin, TRT-LLM) pad the hidden
        # size to 256 and each rank's intermediate size to 128
        # (mxfp4_round_up_hidden_size_and_intermediate_size).
        h = _ceil_div(h, 256) * 256
        shard = 1 if ep > 1 else tp
        inter = _ceil_div(_ceil_div(inter, shard), 128) * 128 * shard
    if ep > 1:
        expert_w = (experts / ep) * 3 * h * inter
    else:
        expert_w = experts * 3 * h * inter / tp
    total = _linear(expert_w, quant, db, expert=True)
    if spec.model_type == "gpt_oss":
        total += (experts / (ep if ep > 1 else 1)) * (3 * inter / (1 if ep > 1 else tp)) * db  # expert biases
    total += router
    if spec.model_type.startswith("deepseek"):
        total += experts * 4  # e_score_correction_bias, fp32
    if spec.num_shared_experts:
        total += _linear(3 * h * spec.shared_expert_intermediate_size / tp, quant, db)
        if spec.model_type.startswith("qwen2_moe"):
            total += h * db  # shared expert gate
    return total


def _layer_bytes(
    spec: ModelSpec, index: int, tp: int, ep: int, quant: QuantSpec | None, db: float, acct: Accounting
) -> float:
    norms = 2 * spec.hidden_size * db
    if spec.model_type.startswith("gemma2") or spec.model_type.startswith("gemma3"):
        norms *= 2  # pre/post norms around attention and MLP
    return _attention_bytes(spec, tp, quant, db, acct) + _mlp_bytes(spec, index, tp, ep, quant, db) + norms


def _vocab_rows(spec: ModelSpec, tp: int) -> int:
    padded = _ceil_div(spec.vocab_size, VOCAB_PAD) * VOCAB_PAD
    return _ceil_div(padded, tp)


def _stage_parts(
    spec: ModelSpec,
    layers: list[int],
    first: bool,
    last: bool,
    tp: int,
    ep: int,
    quant: QuantSpec | None,
    db: float,
    pp: int,
    acct: Accounting,
) -> _Parts:
    parts = _Parts()
    rows = _vocab_rows(spec, tp)
    if first:
        parts.embed = rows * spec.hidden_size * db
        parts.vision = spec.vision_params * db / 1  # vision towers are replicated
    if last:
        parts.head = spec.hidden_size * db  # final norm
        if not spec.tie_word_embeddings or pp > 1:
            head_q = quant if quant is not None and quant.lm_head else None
            parts.head += _linear(rows * spec.hidden_size, head_q, db)
    parts.layer = sum(_layer_bytes(spec, i, tp, ep, quant, db, acct) for i in layers)
    # Rotary cos/sin cache: max_position x rotary_dim in the model dtype.
    if layers:
        parts.other = spec.max_position_embeddings * (spec.rope_dim or spec.head_dim) * db
    return parts


def _file_ratios(spec: ModelSpec, quant: QuantSpec | None, db: float) -> dict[str, float]:
    acct = Accounting.for_version(CURRENT_VLLM)
    """Scale factors from formula bytes to safetensors bytes, per model part."""
    if not spec.file_bytes:
        return {}
    full = _stage_parts(spec, list(range(spec.num_layers)), True, True, 1, 1, quant, db, 1, acct)
    # The absorbed MLA copies are made at load time, not stored in the files.
    if spec.is_mla:
        heads = spec.num_attention_heads
        full.layer -= spec.num_layers * spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim) * db
    ratios: dict[str, float] = {}
    for part in ("embed", "head", "layer"):
        formula = getattr(full, part)
        found = spec.file_bytes.get(part, 0)
        if part == "head" and spec.tie_word_embeddings:
            continue
        if formula > 0 and found > 0:
            ratios[part] = found / formula
    # Absorbed MLA copies and runtime buffers are not in the files.
    return ratios


# --------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------


def _kv_layer_bytes(spec: ModelSpec, tp: int, kv_b: float, acct: Accounting) -> int:
    """Bytes one token takes in one layer's cache on one rank."""
    if spec.is_mla:
        size = int((spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_b)
        if acct.mla_align_bytes:
            size = _ceil_div(size, acct.mla_align_bytes) * acct.mla_align_bytes
        return size
    kv_r = max(1, spec.num_kv_heads // tp) if spec.num_kv_heads >= tp else 1
    return int(2 * kv_r * spec.head_dim * kv_b)


@dataclass(frozen=True)
class _KvLayout:
    """The KV pool of one rank: groups of layers sharing block tables."""

    group_size: int  # layers per group = tensors the pool is split into
    groups: list[str]  # attention type of each group
    page_bytes: int  # bytes of one block in one layer
    window: int
    chunk: int = 0  # attention_chunk_size of the "chunked" groups


CHUNKED_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


def chunked_local_attn_hybrid_kv(env: Mapping[str, str]) -> bool:
    """VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE as vllm/envs.py reads it:
    ``bool(int(os.getenv(name, "1")))``; a value int() refuses stops vLLM at start-up."""
    value = str(env.get(CHUNKED_HYBRID_ENV, "1")).strip()
    try:
        return bool(int(value))
    except ValueError as exc:
        raise PlanError(
            f"--env {CHUNKED_HYBRID_ENV}", f"{value!r} is not an integer (vLLM reads it with int())", "use 0 or 1"
        ) from exc


def _chunked_as_full(spec: ModelSpec, settings: Settings) -> bool:
    """Whether vLLM allocates Llama 4's chunked layers as full attention: the hybrid KV cache
    manager is off (VllmConfig.__post_init__ turns it off for chunked local attention when
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0; CUDA, ROCm and CPU all support it
    otherwise) and the model also has full layers: ``unify_hybrid_kv_cache_specs`` /
    ``_promote_local_kv_cache_specs`` then make every ChunkedLocalAttentionSpec a
    FullAttentionSpec (a model of chunked layers only is uniform and keeps its spec)."""
    types = {spec.layer_type(i) for i in range(spec.num_layers)}
    return not settings.chunked_local_attn_hybrid_kv and {"chunked", "full"} <= types


def _kv_layout(
    spec: ModelSpec,
    layers: list[int],
    tp: int,
    kv_b: float,
    block: int,
    acct: Accounting,
    chunked_as_full: bool = False,
) -> _KvLayout:
    per_token = _kv_layer_bytes(spec, tp, kv_b, acct)
    types = [spec.layer_type(i) for i in layers]
    if chunked_as_full or acct.engine == "v0":
        types = ["full" if t == "chunked" else t for t in types]
    counts = {t: types.count(t) for t in set(types)}
    if acct.engine == "v0" or len(counts) == 1:
        # One group: every layer keeps the whole sequence (V0 ignored windows
        # when sizing, and uniform models have one group anyway).
        only = next(iter(counts)) if len(counts) == 1 else "full"
        return _KvLayout(len(layers), [only], per_token * block, spec.sliding_window, spec.attention_chunk_size)
    group_size = min(counts.values())
    groups: list[str] = []
    for kind in sorted(counts):
        groups += [kind] * _ceil_div(counts[kind], group_size)
    return _KvLayout(group_size, groups, per_token * block, spec.sliding_window, spec.attention_chunk_size)


def _blocks_per_request(layout: _KvLayout, length: int, block: int, mbt: int) -> int:
    total = 0
    for kind in layout.groups:
        if kind == "sliding" and layout.window:
            tokens = min(layout.window - 1 + mbt, length)
            total += _ceil_div(tokens, block) + 1
        elif kind == "chunked" and layout.chunk:
            # ChunkedLocalAttentionSpec.max_admission_blocks_per_request: one chunk plus the
            # in-flight tokens (``mbt``, as for sliding windows), never more than the request;
            # no +1 (unlike a window, a chunk starts on a block boundary).
            total += _ceil_div(min(layout.chunk + mbt, length), block)
        else:
            total += _ceil_div(length, block)
    return total


def _max_len_fit(layout: _KvLayout, blocks: int, block: int, mbt: int, cap: int) -> int:
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _blocks_per_request(layout, mid, block, mbt) <= blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------
# Overheads
# --------------------------------------------------------------------------


def _activation_bytes(
    spec: ModelSpec,
    layers: list[int],
    last: bool,
    tp: int,
    ep: int,
    tokens: int,
    seqs: int,
    db: float,
    acct: Accounting,
) -> float:
    h = spec.hidden_size
    residual = 3 * tokens * h * db  # hidden states, residual, normed input
    mlp = 0.0
    for i in layers:
        if spec.is_moe_layer(i):
            chunk = min(tokens, FUSED_MOE_CHUNK)
            inter = spec.moe_intermediate_size / (1 if ep > 1 else tp)
            topk = max(spec.num_experts_per_tok, 1)
            # fused_moe caches (gate_up out, activation out, per-expert out)
            # for one chunk, router logits (fp32) and the summed output.
            moe = chunk * topk * (3 * inter + h) * db + tokens * spec.num_experts * 4 + tokens * h * db
            if spec.num_shared_experts:
                moe += tokens * 3 * spec.shared_expert_intermediate_size / tp * db
            mlp = max(mlp, moe)
        else:
            mlp = max(mlp, tokens * 3 * spec.intermediate_size / tp * db)
    heads_r = spec.num_attention_heads / tp
    if spec.is_mla:
        attn = tokens * heads_r * (2 * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + spec.v_head_dim) * db
    else:
        kv_r = max(1.0, spec.num_kv_heads / tp)
        attn = tokens * (2 * heads_r + 2 * kv_r) * spec.head_dim * db
    forward = residual + max(mlp, attn)
    if not last:
        return forward
    # Dummy sampler pass: full-vocabulary logits for max_num_seqs rows, while
    # the forward's hidden states are still referenced.
    vocab = _ceil_div(spec.vocab_size, VOCAB_PAD) * VOCAB_PAD
    sampler = seqs * vocab * (db + acct.sampler_bytes) + tokens * h * db
    return max(forward, sampler)


def _non_torch_bytes(tp: int, pp: int, device: Device, acct: Accounting, nvlink: bool) -> tuple[float, float]:
    """(inside the budget, outside it): cuBLAS workspaces, NCCL, custom all-reduce."""
    if device.kind == "cpu":
        return 0.0, 0.0
    base = 0.15 * GIB if acct.engine == "v1" else 0.1 * GIB
    nccl = 0.0
    world = tp * pp
    if world > 1:
        # Two communicators (torch.distributed + PyNccl) per group; buffers per
        # peer grow with the group size, more with NVLink/NVLS channels.
        per_peer = (0.35 if nvlink else 0.2) * GIB
        nccl = 2 * (0.25 * GIB + per_peer * (tp - 1)) if tp > 1 else 0.0
        if pp > 1:
            nccl += 0.2 * GIB
        if tp > 1 and nvlink:
            nccl += 0.1 * GIB * tp / 8  # custom all-reduce IPC buffers
    inside = base + (nccl if acct.nccl_in_budget else 0.0)
    outside = CUDA_CONTEXT_GIB * GIB + (0.0 if acct.nccl_in_budget else nccl)
    return inside, outside


def _capture_sizes(max_num_seqs: int, max_tokens: int) -> list[int]:
    top = min(max_num_seqs * 2, 512, max_tokens)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def _cuda_graph_bytes(
    spec: ModelSpec, layers: list[int], seqs: int, tokens: int, settings: Settings, device: Device
) -> float:
    if settings.enforce_eager or device.kind == "cpu" or not layers:
        return 0.0
    # Piecewise + full decode graphs; ChunkedLocalAttention's metadata builder supports no
    # CUDA graph (AttentionCGSupport.NEVER), so resolve_cudagraph_mode_and_sizes drops
    # FULL_AND_PIECEWISE to PIECEWISE for a model with chunked layers.
    chunked = any(spec.layer_type(i) == "chunked" for i in range(spec.num_layers))
    graphs = (1 if chunked else 2) * len(_capture_sizes(seqs, tokens))
    return graphs * len(layers) * CUDA_GRAPH_MIB_PER_GRAPH_LAYER * MIB


# --------------------------------------------------------------------------
# Defaults vLLM applies
# --------------------------------------------------------------------------


def resolve_batch_defaults(settings: Settings, device: Device, max_model_len: int, world: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as ``vllm serve`` would pick them."""
    acct = Accounting.for_version(settings.vllm_version, settings.engine)
    seqs = settings.max_num_seqs
    tokens = settings.max_num_batched_tokens
    if device.kind == "cpu":
        seqs = seqs or 128 * world
        tokens = tokens or 2048 * world
        return seqs, min(tokens, seqs * max_model_len) if not settings.max_num_batched_tokens else tokens
    if acct.engine == "v0":
        seqs = seqs or 256
        if tokens is None:
            # V0 turned chunked prefill on by default above 32K context.
            tokens = 2048 if max_model_len > 32768 else max(max_model_len, 2048)
        return seqs, tokens
    large = device.total_gib >= 70 and "a100" not in device.name.lower() and "a800" not in device.name.lower()
    if device.total_gib >= 160:
        default_tokens, default_seqs = 16384, 1024
    elif large:
        default_tokens, default_seqs = 8192, 1024
    else:
        default_tokens, default_seqs = 2048, 256
    seqs = seqs or default_seqs
    if tokens is None:
        tokens = min(default_tokens, seqs * max_model_len)
    return seqs, tokens


# --------------------------------------------------------------------------
# The estimate
# --------------------------------------------------------------------------


def estimate(
    spec: ModelSpec,
    device: Device,
    settings: Settings | None = None,
    *,
    devices_per_stage: list[Device] | None = None,
    nvlink: bool = True,
) -> Estimate:
    """Memory of one vLLM instance with ``settings`` on ``device`` GPUs.

    ``devices_per_stage`` gives a different device per PP stage (mixed GPUs);
    otherwise every rank is ``device``.
    """
    settings = settings or Settings()
    settings.validate()
    acct = Accounting.for_version(settings.vllm_version, settings.engine)
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    dp = settings.data_parallel_size
    ep = tp * dp if settings.enable_expert_parallel and spec.is_moe else 1
    notes: list[str] = []
    if not math.isfinite(device.total_gib) or (device.kind != "cpu" and device.total_gib <= 0):
        raise PlanError(
            "--gpu-memory-gib", f"must be positive, got {device.total_gib}", "pass the GPU's total memory in GiB"
        )
    if pp > spec.num_layers:
        raise PlanError(
            "--pipeline-parallel-size",
            f"{pp} stages for {spec.num_layers} layers",
            f"use at most {spec.num_layers} pipeline stages",
        )
    heads = spec.num_attention_heads
    if heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 16]
        raise PlanError(
            "--tensor-parallel-size",
            f"TP={tp} does not divide the {heads} attention heads of {spec.name}",
            f"use one of {divisors}, or pipeline parallelism",
        )
    if not kv_heads_shard(spec, tp):
        raise PlanError(
            "--tensor-parallel-size",
            f"TP={tp} is neither a divisor nor a multiple of the {spec.num_kv_heads} KV heads",
            "use a TP size that divides or is a multiple of the KV heads",
        )
    if spec.is_moe and ep > spec.num_experts:
        raise PlanError(
            "--enable-expert-parallel",
            f"EP size {ep} exceeds {spec.num_experts} experts",
            "use fewer GPUs per instance",
        )
    partition = list(settings.layer_partition) if settings.layer_partition else default_partition(spec.num_layers, pp)
    check_partition(partition, spec.num_layers, pp)
    stage_devices = devices_per_stage or [device] * pp
    if len(stage_devices) != pp:
        raise PlanError(
            "devices_per_stage", f"{len(stage_devices)} devices for {pp} stages", "give one device per stage"
        )

    # Without --max-model-len vLLM serves its own default (ModelSpec.serve_max_model_len).
    mml_cap = spec.serve_max_model_len
    if not settings.max_model_len and mml_cap > LIMITS["max_model_len"]:
        raise PlanError(
            "--max-model-len",
            f"vLLM's default length for {spec.name} is {mml_cap:,} ({spec.derived_max_model_len_key or 'config.json'}),"
            f" above {LIMITS['max_model_len']:,}, the largest the planner accepts",
            "pass --max-model-len with the context you need",
        )
    mml = settings.max_model_len or mml_cap
    derived = spec.derived_max_model_len
    if settings.max_model_len and derived and settings.max_model_len > derived:
        notes.append(
            f"max_model_len {settings.max_model_len} exceeds the model's {spec.derived_max_model_len_key} "
            f"{int(derived) if derived.is_integer() else derived}: "
            "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    smallest = min(stage_devices, key=lambda d: d.total_gib)
    seqs, tokens = resolve_batch_defaults(settings, smallest, mml, tp * pp)
    quant = _quant(spec, settings)
    db = _dtype_bytes(spec, settings, smallest)
    kv_b = _kv_dtype_bytes(settings, db)
    if settings.block_size:
        block = settings.block_size
    elif device.kind == "cpu":
        block = 128
    elif spec.is_mla and acct.engine == "v1" and smallest.sm_major >= 9:
        block = 64
    else:
        block = 16
    ratios = _file_ratios(spec, quant, db)
    chunked_as_full = _chunked_as_full(spec, settings)

    stage_info: list[dict[str, Any]] = []
    start = 0
    for stage, count in enumerate(partition):
        layers = list(range(start, start + count))
        start += count
        dev = stage_devices[stage]
        first, last = stage == 0, stage == pp - 1
        parts = _stage_parts(spec, layers, first, last, tp, ep, quant, db, pp, acct)
        weights = (
            parts.embed * ratios.get("embed", 1.0)
            + parts.head * ratios.get("head", 1.0)
            + parts.layer * ratios.get("layer", 1.0)
            + parts.vision
            + parts.other
        )
        act = _activation_bytes(spec, layers, last, tp, ep, tokens, min(seqs, tokens), db, acct)
        nt_in, nt_out = _non_torch_bytes(tp, pp, dev, acct, nvlink)
        graphs = _cuda_graph_bytes(spec, layers, seqs, tokens, settings, dev)
        budget = dev.total_gib * GIB * settings.gpu_memory_utilization
        available = budget - weights - act - nt_in - (graphs if acct.graphs_in_budget else 0.0)
        if settings.kv_cache_memory_bytes is not None:
            available = float(settings.kv_cache_memory_bytes)
        layout = _kv_layout(spec, layers, tp, kv_b, block, acct, chunked_as_full)
        per_block = layout.page_bytes * layout.group_size
        blocks = int(available // per_block) if available > 0 and per_block else 0
        stage_info.append(
            {
                "layers": layers,
                "weights": weights,
                "act": act,
                "nt": nt_in,
                "nt_out": nt_out,
                "graphs": graphs,
                "budget": budget,
                "available": available,
                "layout": layout,
                "per_block": per_block,
                "blocks": blocks,
                "device": dev,
            }
        )

    num_blocks = min(s["blocks"] for s in stage_info)
    # Requests need blocks in every stage's pool; stages share the block count.
    need = max(_blocks_per_request(s["layout"], mml, block, tokens) for s in stage_info)
    conc = num_blocks / need if need else 0.0
    kv_tokens = num_blocks * block if acct.engine == "v0" else int(conc * mml)
    fit_len = min(_max_len_fit(s["layout"], num_blocks, block, tokens, mml_cap) for s in stage_info)
    assumptions = _llama4_assumptions(spec, chunked_as_full, tokens)

    ranks: list[RankMemory] = []
    for stage, info in enumerate(stage_info):
        layout = info["layout"]
        tok_bytes = int(layout.page_bytes // block * len(info["layers"]))
        for tp_rank in range(tp):
            dev = info["device"]
            ranks.append(
                RankMemory(
                    rank=stage * tp + tp_rank,
                    pp_stage=stage,
                    tp_rank=tp_rank,
                    layers=[info["layers"][0], info["layers"][-1] + 1] if info["layers"] else [0, 0],
                    weights_gib=info["weights"] / GIB,
                    activation_gib=info["act"] / GIB,
                    non_torch_gib=info["nt"] / GIB,
                    cuda_graph_gib=info["graphs"] / GIB,
                    available_kv_gib=info["available"] / GIB,
                    kv_cache_gib=num_blocks * info["per_block"] / GIB,
                    kv_bytes_per_token=tok_bytes,
                    kv_cache_tokens=kv_tokens,
                    num_gpu_blocks=num_blocks,
                    budget_gib=info["budget"] / GIB,
                    total_gib=dev.total_gib,
                    startup_overhead_gib=info["nt_out"] / GIB,
                    parts=_chunked_parts(layout, mml, block, tokens),
                )
            )

    fits, reason = True, "fits"
    worst = min(stage_info, key=lambda s: s["available"])
    if worst["available"] <= 0:
        fits = False
        reason = (
            f"weights and overheads exceed the budget on stage {stage_info.index(worst)} by "
            f"{-worst['available'] / GIB:.2f} GiB (budget {worst['budget'] / GIB:.2f} GiB = "
            f"{worst['device'].total_gib:.2f} GiB x {settings.gpu_memory_utilization})"
        )
    elif num_blocks < need:
        fits = False
        missing = max((need - num_blocks) * s["per_block"] for s in stage_info) / GIB
        reason = (
            f"the KV cache holds {kv_tokens} tokens but one request of max_model_len={mml} needs "
            f"{need * block} ({missing:.2f} GiB more); the largest max_model_len that fits is {fit_len}"
        )
    else:
        for info in stage_info:
            dev = info["device"]
            if dev.kind == "cpu":
                continue
            needed = info["budget"] + info["nt_out"]
            free = (dev.free_gib if dev.free_gib is not None else dev.total_gib) * GIB
            if needed > free:
                fits = False
                reason = (
                    f"gpu_memory_utilization {settings.gpu_memory_utilization} asks for "
                    f"{info['budget'] / GIB:.2f} GiB but only {(free - info['nt_out']) / GIB:.2f} GiB is free after "
                    f"the CUDA context and NCCL ({info['nt_out'] / GIB:.2f} GiB); lower it"
                )
                break
    if acct.graphs_in_budget is False and any(s["graphs"] > 0 for s in stage_info):
        notes.append("CUDA graphs are captured after the KV cache is sized (outside the budget)")
    return Estimate(
        model=spec.name,
        device=device.name,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        enable_expert_parallel=ep > 1,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_model_len=mml,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=block,
        dtype=settings.dtype if settings.dtype != "auto" else spec.torch_dtype,
        kv_cache_dtype=settings.kv_cache_dtype,
        quantization=quant.method if quant else None,
        enforce_eager=settings.enforce_eager,
        layer_partition=partition,
        ranks=ranks,
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=kv_tokens,
        max_concurrency=conc,
        max_model_len_fit=fit_len,
        fits=fits,
        reason=reason,
        vllm_version=settings.vllm_version,
        notes=notes,
        assumptions=assumptions,
    )


def _chunked_parts(layout: _KvLayout, length: int, block: int, mbt: int) -> dict[str, float]:
    """``kv.chunked_bytes_per_request``: what one request of ``length`` tokens holds in the
    rank's chunked-attention groups (their blocks x the group's layers x one page)."""
    if "chunked" not in layout.groups:
        return {}
    chunked = _KvLayout(layout.group_size, [g for g in layout.groups if g == "chunked"], 0, 0, layout.chunk)
    return {
        "kv.chunked_bytes_per_request": float(
            _blocks_per_request(chunked, length, block, mbt) * layout.group_size * layout.page_bytes
        )
    }


def _llama4_assumptions(spec: ModelSpec, chunked_as_full: bool, mbt: int) -> list[str]:
    """One line each for Llama 4's MoE layout and its chunked local attention."""
    lines: list[str] = []
    if spec.model_type.startswith("llama4") and spec.is_moe:
        moe = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
        lines.append(
            f"Llama 4 MoE (Llama4DecoderLayer): {moe} of {spec.num_layers} layers MoE "
            f"(interleave_moe_layer_step {spec.moe_layer_step}), {spec.num_experts} experts of "
            f"{spec.moe_intermediate_size} + 1 shared expert, top-{spec.num_experts_per_tok}; "
            f"dense layers intermediate_size_mlp {spec.intermediate_size}"
        )
    chunked = sum(spec.layer_type(i) == "chunked" for i in range(spec.num_layers))
    if chunked:
        how = (
            "allocated as full attention (hybrid KV cache manager off: "
            "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0)"
            if chunked_as_full
            else f"hold at most attention_chunk_size + {mbt} tokens per request (ChunkedLocalAttentionSpec, "
            "hybrid KV cache manager; max_num_batched_tokens stands for vLLM's max_in_flight_tokens, as for "
            "sliding windows)"
        )
        lines.append(
            f"chunked local attention: {chunked} of {spec.num_layers} layers (the RoPE layers) attend within "
            f"{spec.attention_chunk_size}-token chunks and {how}; CUDA graphs piecewise only "
            "(the chunked backend supports no full graph)"
        )
    return lines
