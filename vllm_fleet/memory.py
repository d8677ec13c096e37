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

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vllm_fleet import options
from vllm_fleet.accounting.base import (
    ALL2ALL_BACKENDS,
    CUDA_CONTEXT_GIB,
    CUDA_GRAPH_MIB_PER_GRAPH_LAYER,
    CURRENT_VLLM,
    DEEPEP_BUFFER_MIB,
    DEFAULT_ALL2ALL_BACKEND,
    EPLB_WINDOW,
    FUSED_MOE_CHUNK,
    GIB,
    MIB,
    VOCAB_PAD,
    Accounting,
    MoeParallel,
    _ceil_div,
)
from vllm_fleet.accounting.parts import (
    ATTN_KERNEL_ALIGN,
    MLA_HYBRID_ALIGN,
    _file_ratios,
    _indexer_bytes_per_token,
    _kv_layer_bytes,
    _routed_expert_bytes,
    _stage_parts,
)
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
from vllm_fleet.multimodal import (
    QWEN_FAMILIES,
    EncoderProfile,
    VisionSpec,
    encoder_profile,
    parse_limits,
    tower_loaded,
    vision_weight_elements,
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
    # Expert parallelism (ParallelConfig): --enable-eplb, --eplb-config '{"num_redundant_experts": N}'
    # and --all2all-backend.
    enable_eplb: bool = False
    num_redundant_experts: int = 0
    all2all_backend: str = DEFAULT_ALL2ALL_BACKEND
    # Multimodal models (multimodal.py): --limit-mm-per-prompt counts (0 for every modality of
    # a tower: not built, not profiled), --mm-processor-kwargs '{"max_pixels": N}',
    # --skip-mm-profiling and --mm-encoder-tp-mode.
    limit_mm_per_prompt: dict[str, int] | None = None
    mm_max_pixels: int | None = None
    skip_mm_profiling: bool = False
    mm_encoder_tp_mode: str = "weights"
    # Options users turn on; vllm_fleet/options.py models their memory. ``speculative_config``
    # is vllm serve's --speculative-config JSON; ``draft_spec`` the draft model it names
    # (EAGLE / draft_model), resolved by the caller with load_model.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"
    fully_sharded_loras: bool = False
    speculative_config: dict[str, Any] | None = None
    draft_spec: ModelSpec | None = None
    cpu_offload_gb: float = 0.0
    enable_prefix_caching: bool | None = None
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
        if self.limit_mm_per_prompt is not None:
            self.limit_mm_per_prompt = parse_limits(self.limit_mm_per_prompt)
        check_count(self.mm_max_pixels, "--mm-processor-kwargs max_pixels", 1 << 36)
        if self.mm_encoder_tp_mode not in ("weights", "data"):
            raise PlanError(
                "--mm-encoder-tp-mode", f"must be weights or data, got {self.mm_encoder_tp_mode!r}", "use weights"
            )
        if self.dtype not in ("auto", "bfloat16", "float16", "float32", "half", "float"):
            raise PlanError("--dtype", f"unknown dtype '{self.dtype}'", "use auto, bfloat16, float16 or float32")
        if self.kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"):
            raise PlanError(
                "--kv-cache-dtype",
                f"unknown KV cache dtype '{self.kv_cache_dtype}'",
                "use auto, fp8, fp8_e4m3 or fp8_e5m2",
            )
        redundant = self.num_redundant_experts
        if isinstance(redundant, bool) or not isinstance(redundant, int) or not 0 <= redundant <= 1 << 16:
            raise PlanError("--eplb-config", f"num_redundant_experts must be 0 or more, got {redundant!r}", "e.g. 32")
        if redundant and not self.enable_eplb:
            # FusedMoE (layer.py): "Redundant experts are only supported with EPLB."
            raise PlanError(
                "--eplb-config", "redundant experts are only supported with EPLB (vLLM asserts it)", "add --enable-eplb"
            )
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise PlanError(
                "--all2all-backend",
                f"unknown all2all backend '{self.all2all_backend}'",
                "use one of " + ", ".join(sorted(ALL2ALL_BACKENDS)),
            )
        options.validate(self)


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
    # The multimodal vllm serve options the estimate was made with (render.vllm_args adds them).
    mm_serve_args: list[str] = field(default_factory=list)
    # The vllm serve flags of the options planned with (options.serve_args: LoRA,
    # --speculative-config, --cpu-offload-gb), rendered into the plan's argv.
    option_args: list[str] = field(default_factory=list)

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
        if self.option_args:
            data["option_args"] = self.option_args
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


def moe_parallel(spec: ModelSpec, settings: Settings) -> MoeParallel:
    """vLLM's MoE parallel layout for ``settings``:

    * ``FusedMoEParallelConfig.make``: EP is on when ``--enable-expert-parallel`` and
      dp x tp > 1, over ep_size = dp x tp ranks, each holding whole experts (MoE TP 1);
      without EP the expert weights are TP-sharded over all dp x tp ranks
      (``flatten_tp_across_dp_and_pcp``), not only the tp of the attention;
    * ``determine_expert_map``: global // ep experts per rank, the first global % ep ranks one
      more (global = experts + ``num_redundant_experts`` of EPLB);
    * with dp > 1 every MoE layer all-gathers the tokens of the DP group before the experts
      (``AgRsAll2AllManager.dispatch`` / the naive DP path without EP; sequence-parallel MoE
      with tp > 1 splits them over tp first and gathers over dp x tp: the same dp x N), so one
      rank's MoE activation covers dp x its own tokens;
    * all2all kernels (``use_all2all_kernels``) only with EP and dp > 1; "naive" and "pplx" run
      as allgather_reducescatter (``ParallelConfig.__post_init__``).
    """
    tp, dp = settings.tensor_parallel_size, settings.data_parallel_size
    use_ep = spec.is_moe and settings.enable_expert_parallel and tp * dp > 1
    ep = tp * dp if use_ep else 1
    total = spec.num_experts + (settings.num_redundant_experts if settings.enable_eplb else 0)
    backend = settings.all2all_backend
    if backend in ("naive", "pplx"):
        backend = DEFAULT_ALL2ALL_BACKEND
    return MoeParallel(
        ep_size=ep,
        moe_tp=1 if use_ep else tp * dp,
        global_experts=total,
        local_experts=_ceil_div(total, ep),
        dispatch_ranks=dp if spec.is_moe and dp > 1 else 1,
        all2all=backend if use_ep and dp > 1 else "",
    )


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


def _mamba_state(spec: ModelSpec, tp: int, db: float) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
    """(shapes, bytes per element) of one mamba-type layer's state on one rank, as vLLM's
    ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` give them (conv state
    in the "SD" layout; mamba_cache_dtype auto = the model dtype; the SSM state in
    mamba_ssm_cache_dtype, float32 for Nemotron-H by NemotronHForCausalLMConfig)."""
    ssm_b = DTYPE_BYTES.get(spec.mamba_ssm_cache_dtype, db) if spec.mamba_ssm_cache_dtype else db
    if spec.linear_num_value_heads:  # gated_delta_net_state_shape
        conv_dim = 2 * spec.linear_key_head_dim * spec.linear_num_key_heads
        conv_dim += spec.linear_value_head_dim * spec.linear_num_value_heads
        conv = (spec.linear_conv_kernel_dim - 1, conv_dim // tp)
        ssm: tuple[int, ...] = (spec.linear_num_value_heads // tp, spec.linear_value_head_dim, spec.linear_key_head_dim)
        return (conv, ssm), (db, ssm_b)
    if spec.mamba_version == 1:  # mamba1_state_shape
        inner = spec.mamba_intermediate // tp
        return ((spec.mamba_d_conv - 1, inner), (inner, spec.mamba_d_state)), (db, ssm_b)
    groups = spec.mamba_n_groups + (0 if spec.mamba_n_groups % tp == 0 else tp - spec.mamba_n_groups)
    conv_dim = spec.mamba_intermediate + 2 * groups * spec.mamba_d_state  # mamba2_state_shape
    conv = (spec.mamba_d_conv - 1, conv_dim // tp)
    ssm = (spec.mamba_n_heads // tp, spec.mamba_head_dim, spec.mamba_d_state)
    return (conv, ssm), (db, ssm_b)


def _mamba_state_bytes(spec: ModelSpec, tp: int, db: float) -> int:
    """MambaSpec.page_size_bytes before padding: one sequence's state in one layer."""
    shapes, sizes = _mamba_state(spec, tp, db)
    return int(sum(math.prod(shape) * size for shape, size in zip(shapes, sizes, strict=True)))


@dataclass(frozen=True)
class _KvGroup:
    """One KV cache group (KVCacheGroupSpec): layers sharing a block table."""

    kind: str  # "full", "sliding", "chunked" or "mamba"
    layers: tuple[int, ...]
    page_bytes: int  # one block of one layer (after the page sizes are unified)
    block: int  # tokens per block
    window: int = 0
    chunk: int = 0  # attention_chunk_size of a "chunked" group (ChunkedLocalAttentionSpec)


@dataclass(frozen=True)
class _KvLayout:
    """The whole model's KV cache groups (vLLM groups the merged specs of all ranks)."""

    groups: tuple[_KvGroup, ...]
    block: int  # the attention block size (hybrid mamba models: aligned to the mamba page)
    token_bytes: int  # attention bytes per token and layer
    mamba_state_bytes: int = 0  # per sequence and mamba layer, unpadded
    mamba_mode: str = "none"
    in_flight: int = 0  # vLLM's max_in_flight_tokens

    def bytes_per_block(self, layers: list[int]) -> int:
        """``_get_kv_cache_bytes_per_block`` on one rank: the largest group's pages."""
        here = set(layers)
        return max((sum(g.page_bytes for i in g.layers if i in here) for g in self.groups), default=0)

    def blocks_per_request(self, length: int, acct: Accounting) -> int:
        """``get_max_concurrency_for_kv_cache_config``: the sum over groups of
        cdiv(max_memory_usage_bytes, page_size_bytes) for a request of ``length`` tokens."""
        return sum(self.group_blocks(g, length) for g in self.groups)

    def group_blocks(self, g: _KvGroup, length: int) -> int:
        """One group's blocks for a request of ``length`` tokens (its spec's
        ``max_memory_usage_bytes`` / page)."""
        if g.kind == "mamba":
            # MambaSpec.max_memory_usage_bytes: 2 blocks in "align" mode, else 1.
            return 2 if self.mamba_mode == "align" else 1
        if g.kind == "sliding" and g.window:
            # SlidingWindowSpec.max_admission_blocks_per_request.
            return _ceil_div(min(g.window - 1 + self.in_flight, length), g.block) + 1
        if g.kind == "chunked" and g.chunk:
            # ChunkedLocalAttentionSpec.max_admission_blocks_per_request: one chunk plus the
            # in-flight tokens (max_in_flight_tokens, as for sliding windows), never more than
            # the request; no +1 (unlike a window, a chunk starts on a block boundary).
            return _ceil_div(min(g.chunk + self.in_flight, length), g.block)
        return _ceil_div(length, g.block)

    def attention_layers(self, layers: list[int]) -> int:
        here = set(layers)
        return sum(1 for g in self.groups if g.kind != "mamba" for i in g.layers if i in here)


def _attention_block(spec: ModelSpec, token_bytes: int, mamba_page: int, block: int) -> int:
    """``Platform._align_hybrid_block_size``: the smallest attention block (a multiple of
    the kernel block, at least ``block``) whose page holds one mamba state."""
    align = max(ATTN_KERNEL_ALIGN, block)
    if spec.is_mla:
        align = max(align, MLA_HYBRID_ALIGN)
    size = align * _ceil_div(mamba_page, align * token_bytes)
    size = ATTN_KERNEL_ALIGN * _ceil_div(size, ATTN_KERNEL_ALIGN)
    return max(block, size)


def _group_layers(buckets: dict[tuple[str, int], list[int]]) -> list[tuple[str, int, tuple[int, ...]]]:
    """``_get_kv_cache_groups_uniform_page_size``: split each bucket of same-spec layers
    into groups of the same size (the smallest bucket; the largest when it is below 1.5x
    the smallest), layers[i::n] to the i-th of a bucket's n groups."""
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    out: list[tuple[str, int, tuple[int, ...]]] = []
    for (kind, size), layers in buckets.items():
        n = _ceil_div(len(layers), group_size)
        out += [(kind, size, tuple(layers[i::n])) for i in range(n)]
    return out


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


def _kv_kind(spec: ModelSpec, index: int, chunked_as_full: bool) -> str:
    """The KV cache spec an attention layer asks for: "sliding" (SlidingWindowSpec),
    "chunked" (ChunkedLocalAttentionSpec, unless ``unify_hybrid_kv_cache_specs`` promotes
    it to full attention) or "full"."""
    kind = spec.layer_type(index)
    if kind == "sliding" and spec.sliding_window:
        return "sliding"
    if kind == "chunked" and spec.attention_chunk_size and not chunked_as_full:
        return "chunked"
    return "full"


def _kv_layout(
    spec: ModelSpec,
    tp: int,
    kv_b: float,
    block: int,
    acct: Accounting,
    db: float,
    settings: Settings,
    tokens: int,
    mml: int,
    device_kind: str,
    draft_layers: int = 0,
) -> _KvLayout:
    """The KV cache groups of the whole model (``get_kv_cache_groups``): one group when
    every layer has the same spec; otherwise one bucket per spec (full attention,
    each sliding window, each chunk size of chunked local attention, mamba) split into
    equal groups; with ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0`` chunked
    layers next to full ones join the full bucket. ``draft_layers``: full-attention
    layers of a speculative drafter with the target's page size (MTP modules), numbered
    after the target's layers; they join the last stage's pool (the runner's
    ``get_kv_cache_spec`` lists them with the target's)."""
    token_bytes = _kv_layer_bytes(spec, tp, kv_b, acct)
    all_layers = list(range(spec.num_layers))
    drafts = list(range(spec.num_layers, spec.num_layers + draft_layers))
    in_flight = tokens * _in_flight_batches(acct, settings.pipeline_parallel_size, device_kind)
    mamba_layers = [i for i in all_layers if spec.has_mamba(i)] if acct.engine == "v1" else []
    attn_layers = [i for i in all_layers if spec.has_attention(i) or not spec.is_hybrid]
    state = _mamba_state_bytes(spec, tp, db) if mamba_layers else 0
    # Prefix caching is vLLM's default (None here).
    mode = "none" if settings.enable_prefix_caching is False else "align"
    if mamba_layers and attn_layers:
        block = _attention_block(spec, token_bytes, state, block)
    page = token_bytes * block
    if mamba_layers and not attn_layers:
        page = state
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0: chunked layers promoted to full.
    as_full = _chunked_as_full(spec, settings)
    # The window (sliding) or chunk (chunked) a bucket's spec carries; 0 for the others.
    sizes = {"sliding": spec.sliding_window, "chunked": spec.attention_chunk_size}
    if acct.engine == "v0" or not mamba_layers:
        kinds = {_kv_kind(spec, i, as_full) for i in attn_layers} | ({"full"} if drafts else set())
        if acct.engine == "v0" or len(kinds) == 1:
            # One group: every layer keeps the whole sequence (V0 ignored windows and chunks
            # when sizing; a uniform model has one group anyway).
            only = "full" if acct.engine == "v0" else next(iter(kinds))
            size = sizes.get(only, 0)
            window, chunk = (size, 0) if only == "sliding" else (0, size)
            group = _KvGroup(only, tuple(attn_layers + drafts), page, block, window, chunk)
            return _KvLayout((group,), block, token_bytes, in_flight=in_flight)
    # get_kv_cache_groups: one bucket per spec (full, each sliding window, each chunk size,
    # mamba), in the order the layers first ask for it.
    buckets: dict[tuple[str, int], list[int]] = {}
    for i in all_layers:
        if spec.has_attention(i) or not spec.is_hybrid:
            kind = _kv_kind(spec, i, as_full)
            buckets.setdefault((kind, sizes.get(kind, 0)), []).append(i)
    if drafts:
        buckets.setdefault(("full", 0), []).extend(drafts)
    for i in mamba_layers:
        buckets.setdefault(("mamba", 0), []).append(i)
    mamba_block = block if mode == "align" else mml
    groups = tuple(
        _KvGroup(
            kind,
            layers,
            page,
            mamba_block if kind == "mamba" else block,
            window=size if kind == "sliding" else 0,
            chunk=size if kind == "chunked" else 0,
        )
        for kind, size, layers in _group_layers(buckets)
    )
    return _KvLayout(groups, block, token_bytes, state, mode, in_flight)


def _kv_parts(
    spec: ModelSpec, layout: _KvLayout, tp: int, acct: Accounting, mml: int
) -> tuple[Callable[[list[int]], dict[str, float]], list[str]]:
    """The KV parts of a rank (``kv.*_bytes``) and one assumptions line each, for the
    models whose cache is more than one group of full attention."""
    lines: list[str] = []
    kinds = [g.kind for g in layout.groups]
    hybrid = len(layout.groups) > 1
    if hybrid:
        shown = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
        lines.append(
            f"KV groups: {len(layout.groups)} ({shown}) of up to {max(len(g.layers) for g in layout.groups)} layers, "
            "sharing one block pool (get_kv_cache_groups); a request holds blocks in every group"
        )
    if any(g.kind == "sliding" for g in layout.groups):
        lines.append(
            f"sliding window {spec.sliding_window}: a request keeps window - 1 + {layout.in_flight:,} in-flight tokens "
            "(+1 block) per sliding group (SlidingWindowSpec.max_admission_blocks_per_request)"
        )
    if layout.mamba_state_bytes:
        lines.append(
            f"mamba state: {layout.mamba_state_bytes:,} bytes per sequence and layer on each rank (TP={tp}), padded "
            f"to the attention page; attention block {layout.block} tokens (Platform._align_hybrid_block_size); "
            f"mamba_cache_mode {layout.mamba_mode}: {2 if layout.mamba_mode == 'align' else 1} block(s) per request "
            "per mamba group"
        )
    if layout.mamba_state_bytes:
        lines.append(
            "mamba-type mixers: weights parameter by parameter (MambaMixer / MambaMixer2 / GatedDeltaNet); their "
            "activation peak approximated by the in_proj and gated outputs of one forward pass"
        )
    if spec.index_topk:
        lines.append(
            f"DeepSeek V3.2 indexer: {_indexer_bytes_per_token(spec)} bytes per token and layer (fp8 keys + fp32 "
            "scales, DeepseekV32IndexerCache) in the MLA group, on every rank; its weights replicated and the "
            "int32 top-k index buffer (max_num_batched_tokens x index_topk) counted with the weights"
        )

    def parts(layers: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        if hybrid:
            out["kv.groups"] = len(layout.groups)
            out["kv.page_bytes"] = layout.groups[0].page_bytes
        if layout.mamba_state_bytes:
            mamba = sum(1 for g in layout.groups if g.kind == "mamba" for i in g.layers if i in set(layers))
            out["kv.ssm_state_bytes_per_seq"] = layout.mamba_state_bytes * mamba
            out["kv.attention_block_size"] = layout.block
        if spec.index_topk:
            out["kv.indexer_bytes_per_token"] = _indexer_bytes_per_token(spec) * layout.attention_layers(layers)
        chunked = [g for g in layout.groups if g.kind == "chunked"]
        if chunked:
            # What one request of max_model_len holds in the rank's chunked groups: each
            # group's blocks x its layers on the rank x one page.
            here = set(layers)
            out["kv.chunked_bytes_per_request"] = float(
                sum(layout.group_blocks(g, mml) * sum(1 for i in g.layers if i in here) * g.page_bytes for g in chunked)
            )
        return out

    return parts, lines


def _in_flight_batches(acct: Accounting, pp: int, device_kind: str) -> int:
    """``VllmConfig.max_concurrent_batches`` (max_in_flight_tokens = it x
    max_num_batched_tokens): async scheduling is on by default and Model Runner V2 keeps
    pp + 1 batches in flight; the CPU build runs the V1 runner (2 batches, none beyond PP
    with PP, where async scheduling is off). Releases before the current accounting
    reserved one batch (the planner's rule for them)."""
    if not acct.in_flight_batches:
        return 1
    if device_kind == "cpu":
        return 2 if pp == 1 else pp
    return pp + 1


def _reported_tokens(layout: _KvLayout, num_blocks: int, conc: float, mml: int, acct: Accounting) -> int:
    """The "GPU KV cache size: N tokens" line: int(max_concurrency x max_model_len)
    (``get_kv_cache_capacity``); releases before 0.21 printed num_blocks // groups x the
    smallest block size (``_report_kv_cache_config``), which is what hybrid logs of those
    releases show. V0 printed num_blocks x block_size."""
    if acct.engine == "v0":
        return num_blocks * layout.block
    if not acct.tokens_from_concurrency:
        return num_blocks // max(len(layout.groups), 1) * min(g.block for g in layout.groups)
    return int(conc * mml)


def _max_len_fit(layout: _KvLayout, blocks: int, cap: int, acct: Accounting) -> int:
    """``_estimate_max_model_len_from_groups``: the largest length whose blocks fit, the
    null block held back (0.32: the check plans against available - one block)."""
    usable = blocks - (1 if acct.null_block_reserved else 0)
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if layout.blocks_per_request(mid, acct) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------
# Overheads
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _MoeActivation:
    """One MoE layer's transient bytes in the profile pass."""

    total: float  # everything at the layer's peak
    workspace: float  # the fused-MoE workspaces
    dispatched: float  # what the tokens gathered from the other DP / EP ranks add


def _moe_activation(
    spec: ModelSpec, tp: int, ep: int, tokens: int, db: float, acct: Accounting, moe: MoeParallel | None = None
) -> _MoeActivation:
    """The MoE layer's peak over ``tokens`` local tokens.

    With dp > 1 the layer all-gathers the tokens of the whole DP group first (``moe.
    dispatch_ranks``; the profile's dummy batch is ``max_num_batched_tokens`` on every DP rank,
    ``_dummy_run`` after ``coordinate_batch_across_dp``), so its hidden states, router logits,
    top-k ids / weights and workspaces cover dp x tokens. 0.32's workspaces are
    ``TritonExperts.workspace_shapes`` for all M of them (``FusedMoEKernel._allocate_buffers``:
    workspace13 (M, topk, max(N / 2, K)), shared with the (M, K) output, and workspace2
    (M, topk, max(N, K)), N = 2 x the rank's intermediate size, K = hidden) kept by the
    workspace manager; older releases: the planner's chunked estimate."""
    h = spec.hidden_size
    shard = moe.moe_tp if moe is not None else (1 if ep > 1 else tp)
    inter = spec.moe_intermediate_size / shard
    topk = max(spec.num_experts_per_tok, 1)
    gather = moe.dispatch_ranks if moe is not None else 1

    def workspace(m: int) -> float:
        if acct.moe_unchunked:
            return max(m * topk * max(inter, h), m * h) * db + m * topk * max(2 * inter, h) * db
        # fused_moe caches (gate_up out, activation out, per-expert out) for one chunk.
        return min(m, FUSED_MOE_CHUNK) * topk * (3 * inter + h) * db

    def layer(m: int) -> float:
        # Workspaces, router logits (fp32) and the summed output of the local tokens; the
        # gathered hidden states and top-k ids / weights (int32 + fp32) when tokens came in.
        total = workspace(m) + m * spec.num_experts * 4 + tokens * h * db
        if m > tokens:
            total += m * h * db + m * topk * 8
        return total

    gathered = tokens * gather
    full = layer(gathered)
    return _MoeActivation(full, workspace(gathered), full - layer(tokens))


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
    moe: MoeParallel | None = None,
) -> float:
    h = spec.hidden_size
    residual = 3 * tokens * h * db  # hidden states, residual, normed input
    mlp = 0.0
    for i in layers:
        if spec.is_moe_layer(i):
            moe_peak = _moe_activation(spec, tp, ep, tokens, db, acct, moe).total
            if spec.num_shared_experts:
                moe_peak += tokens * 3 * spec.shared_expert_intermediate_size / tp * db
            mlp = max(mlp, moe_peak)
        else:
            mlp = max(mlp, tokens * 3 * spec.intermediate_size / tp * db)
    heads_r = spec.num_attention_heads / tp
    if spec.is_mla:
        attn = tokens * heads_r * (2 * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) + spec.v_head_dim) * db
    else:
        kv_r = max(1.0, spec.num_kv_heads / tp)
        attn = tokens * (2 * heads_r + 2 * kv_r) * spec.head_dim * db
    if any(spec.has_mamba(i) for i in layers):
        # Approximation: a mamba-type mixer's peak taken as its in_proj output plus its
        # gated output (the SSM / delta-rule kernels' own scratch is not modelled).
        if spec.linear_num_value_heads:
            k = spec.linear_key_head_dim * spec.linear_num_key_heads
            v = spec.linear_value_head_dim * spec.linear_num_value_heads
            width = (2 * k + 3 * v + 2 * spec.linear_num_value_heads) / tp
        else:
            width = (3 * spec.mamba_intermediate + 2 * spec.mamba_n_groups * spec.mamba_d_state) / tp
            width += spec.mamba_n_heads / tp
        attn = max(attn, tokens * width * db)
    forward = residual + max(mlp, attn)
    if not last:
        return forward
    # Dummy sampler pass: full-vocabulary logits for max_num_seqs rows, while
    # the forward's hidden states are still referenced.
    vocab = _ceil_div(spec.vocab_size, VOCAB_PAD) * VOCAB_PAD
    sampler = seqs * vocab * (db + acct.sampler_bytes) + tokens * h * db
    return max(forward, sampler)


def _all2all_buffer_bytes(moe: MoeParallel | None) -> float:
    """DeepEP's ``deep_ep.Buffer`` NVLink bytes (``VLLM_DEEPEP_BUFFER_SIZE_MB``) that
    ``DeepEPHTAll2AllManager`` / ``DeepEPLLAll2AllManager._make_all2all_kwargs`` ask for, made
    when the MoE layers build their prepare/finalize (after the startup snapshot, outside
    torch: non-torch memory inside the budget). allgather_reducescatter (the default) keeps
    no buffer of its own: its all-gathers are activations (``_moe_activation``)."""
    if moe is None or moe.all2all not in ("deepep_high_throughput", "deepep_low_latency"):
        return 0.0
    return DEEPEP_BUFFER_MIB * MIB


def _non_torch_bytes(
    tp: int, pp: int, device: Device, acct: Accounting, nvlink: bool, moe: MoeParallel | None = None
) -> tuple[float, float]:
    """(inside the budget, outside it): cuBLAS workspaces, NCCL, custom all-reduce, all2all buffers."""
    if device.kind == "cpu":
        return 0.0, 0.0
    base = 0.15 * GIB if acct.engine == "v1" else 0.1 * GIB
    base += _all2all_buffer_bytes(moe)
    nccl = 0.0
    world = tp * pp
    if world > 1:
        # Two communicators (torch.distributed + PyNccl) per group; buffers per
        # peer grow with the group size, more with NVLink/NVLS channels.
        per_peer = (0.35 if nvlink else 0.2) * GIB
        nccl = 2 * (0.25 * GIB + per_peer * (tp - 1)) if tp > 1 else 0.0
        if pp > 1:
            nccl += 0.2 * GIB
        # Custom all-reduce IPC buffers: CustomAllreduce refuses more than two PCIe-only GPUs
        # (not fully connected), so without NVLink only a pair keeps them.
        if tp > 1 and (nvlink or tp == 2):
            nccl += 0.1 * GIB * tp / 8
    inside = base + (nccl if acct.nccl_in_budget else 0.0)
    outside = CUDA_CONTEXT_GIB * GIB + (0.0 if acct.nccl_in_budget else nccl)
    return inside, outside


def _capture_sizes(max_num_seqs: int, max_tokens: int, query_len: int = 1) -> list[int]:
    """``VllmConfig._set_cudagraph_sizes``; ``query_len`` is ``uniform_decode_query_len``
    (1 + num_speculative_tokens): the ceiling grows with it and the uniform decode sizes
    (request counts x query_len) are added."""
    ceiling = min(max_num_seqs * query_len * 2, 512)
    top = min(ceiling, max_tokens)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if query_len > 1:
        reqs = min(max_num_seqs, 512)
        counts = [n for n in (1, 2, 4) if n <= reqs] + list(range(8, min(reqs + 1, 256), 8))
        counts += [*range(256, reqs + 1, 16), reqs]
        sizes = sorted(set(sizes) | {n * query_len for n in counts if n * query_len <= min(ceiling, max_tokens)})
    return sizes


def _cuda_graph_bytes(
    spec: ModelSpec,
    layers: list[int],
    seqs: int,
    tokens: int,
    settings: Settings,
    device: Device,
    query_len: int = 1,
    extra_layers: int = 0,
    cases: int = 1,
) -> float:
    """``extra_layers``: a drafter's layers captured with the target's sizes; ``cases``: the
    LoRA capture cases (options.lora_graph_cases)."""
    if settings.enforce_eager or device.kind == "cpu" or not layers:
        return 0.0
    # Piecewise + full decode graphs; ChunkedLocalAttention's metadata builder supports no
    # CUDA graph (AttentionCGSupport.NEVER), so resolve_cudagraph_mode_and_sizes drops
    # FULL_AND_PIECEWISE to PIECEWISE for a model with chunked layers.
    chunked = any(spec.layer_type(i) == "chunked" for i in range(spec.num_layers))
    graphs = (1 if chunked else 2) * len(_capture_sizes(seqs, tokens, query_len)) * cases
    return graphs * (len(layers) + extra_layers) * CUDA_GRAPH_MIB_PER_GRAPH_LAYER * MIB


def _moe_parts(
    spec: ModelSpec,
    layers: list[int],
    tp: int,
    ep: int,
    tokens: int,
    quant: QuantSpec | None,
    db: float,
    acct: Accounting,
    moe: MoeParallel | None,
    layer_ratio: float,
    eplb: bool,
) -> dict[str, float]:
    """The named MoE parts of one stage's ranks (GiB), when EP, DP or EPLB changes them:

    * ``weights.routed_experts_gib``: the routed experts the busiest rank holds (already in
      the layer weights);
    * ``weights.eplb_buffers_gib``: what ``EplbState.add_model`` allocates while the model
      loads (counted in "Model loading took"): ``expert_buffer``, one MoE layer's local
      experts (``torch.empty_like`` of ``expert_weights[0]``), and the int32 load window
      (``EPLBConfig.window_size`` x MoE layers x physical experts) with its pass buffer;
      added to the weights here;
    * ``activation.moe_workspace_gib``: the fused-MoE workspaces over the dispatched tokens;
    * ``activation.moe_all2all_gib``: what the tokens gathered from the other DP / EP ranks add
      to the MoE layer's peak (both already in the activation);
    * ``non_torch.all2all_buffers_gib``: DeepEP's buffers (already in non-torch).
    """
    moe_layers = [i for i in layers if spec.is_moe_layer(i)]
    if moe is None or not moe_layers or (moe.ep_size == 1 and moe.dispatch_ranks == 1 and not eplb):
        return {}
    one_layer = _routed_expert_bytes(spec, tp, ep, quant, db, moe) * layer_ratio
    parts = {"weights.routed_experts_gib": len(moe_layers) * one_layer / GIB}
    if eplb:
        load = (EPLB_WINDOW + 1) * len(moe_layers) * moe.global_experts * 4
        parts["weights.eplb_buffers_gib"] = (one_layer + load) / GIB
    act = _moe_activation(spec, tp, ep, tokens, db, acct, moe)
    parts["activation.moe_workspace_gib"] = act.workspace / GIB
    if act.dispatched:
        parts["activation.moe_all2all_gib"] = act.dispatched / GIB
    buffers = _all2all_buffer_bytes(moe)
    if buffers:
        parts["non_torch.all2all_buffers_gib"] = buffers / GIB
    return parts


def _moe_assumptions(
    spec: ModelSpec, settings: Settings, moe: MoeParallel | None, tokens: int, nvlink: bool, device: Device
) -> list[str]:
    """One line per MoE / EP rule the estimate applied (``Estimate.assumptions``)."""
    lines: list[str] = []
    tp = settings.tensor_parallel_size
    if moe is not None and (moe.ep_size > 1 or moe.dispatch_ranks > 1 or settings.enable_eplb):
        if moe.ep_size > 1:
            redundant = moe.global_experts - spec.num_experts
            extra = f" ({spec.num_experts} + {redundant} redundant)" if redundant else ""
            lines.append(
                f"EP={moe.ep_size}: {moe.local_experts} of {moe.global_experts}{extra} experts on the busiest rank"
                " (determine_expert_map, linear), whole experts (MoE TP 1)"
            )
        else:
            lines.append(
                f"MoE without EP: expert weights TP-sharded over all {moe.moe_tp} ranks (dp x tp,"
                " FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp)"
            )
        if moe.dispatch_ranks > 1:
            how = moe.all2all or "naive DP all-gather"
            lines.append(
                f"MoE layers all-gather the tokens of {moe.dispatch_ranks} DP ranks ({how}): the profile's MoE"
                f" activation covers {moe.dispatch_ranks} x {tokens:,} = {moe.dispatch_ranks * tokens:,} tokens"
            )
        if moe.all2all in ("deepep_high_throughput", "deepep_low_latency"):
            lines.append(
                f"{moe.all2all}: {DEEPEP_BUFFER_MIB} MiB DeepEP NVLink buffer (VLLM_DEEPEP_BUFFER_SIZE_MB) in"
                " non-torch; its RDMA buffer (across nodes, low-latency size hint) is not counted, and its"
                " dispatch activation is approximated by the all-gather's dp x tokens"
            )
        elif moe.all2all and moe.all2all != DEFAULT_ALL2ALL_BACKEND:
            lines.append(f"{moe.all2all}: its own buffers are not modelled (only the gathered activations)")
        if settings.enable_eplb:
            lines.append(
                f"EPLB: one MoE layer's local experts (expert_buffer) and a {EPLB_WINDOW}-step int32 load window"
                " counted in the weights"
            )
    if tp > 1 and not nvlink and device.kind == "cuda":
        state = "kept (two GPUs)" if tp == 2 else "off (CustomAllreduce: more than two PCIe-only GPUs)"
        lines.append(f"PCIe without NVLink: custom all-reduce {state}; NCCL buffers outside the budget")
    return lines


# --------------------------------------------------------------------------
# Multimodal towers (multimodal.py)
# --------------------------------------------------------------------------


def _vision(spec: ModelSpec, settings: Settings) -> VisionSpec | None:
    """The tower with ``--mm-processor-kwargs '{"max_pixels": N}'`` applied (Qwen: the flat
    kwarg reaches both images_kwargs and videos_kwargs, ``_merge_and_resolve_mm_processor_kwargs``)."""
    vision = spec.vision
    if vision is None or not settings.mm_max_pixels or vision.family not in QWEN_FAMILIES:
        return vision
    px = settings.mm_max_pixels
    return replace(
        vision,
        image_max_pixels=px,
        video_max_pixels=px if vision.video_max_pixels else 0,
        pixels_source="--mm-processor-kwargs max_pixels",
    )


def _vision_weight_bytes(spec: ModelSpec, vision: VisionSpec, tp: int, db: float, data_mode: bool) -> float:
    """One rank's tower and projector: the TP-sharded linears split over ``tp`` (whole with
    ``--mm-encoder-tp-mode data``), the rest replicated; scaled to the safetensors bytes of
    the vision tensors when the folder has them."""
    shard, repl = vision_weight_elements(vision)
    total = (shard + repl) * db
    split = 1 if data_mode else tp
    found = (spec.file_bytes or {}).get("vision", 0)
    scale = found / total if found and total else 1.0
    return (shard / split + repl) * db * scale


def _mm_serve_args(settings: Settings) -> list[str]:
    args: list[str] = []
    if settings.limit_mm_per_prompt is not None:
        args += ["--limit-mm-per-prompt", json.dumps(settings.limit_mm_per_prompt, separators=(",", ":"))]
    if settings.mm_max_pixels:
        args += ["--mm-processor-kwargs", json.dumps({"max_pixels": settings.mm_max_pixels})]
    if settings.skip_mm_profiling:
        args.append("--skip-mm-profiling")
    if settings.mm_encoder_tp_mode != "weights":
        args += ["--mm-encoder-tp-mode", settings.mm_encoder_tp_mode]
    return args


def _mm_parts(info: dict[str, Any]) -> dict[str, float]:
    parts = {"weights.vision_gib": info["vision"] / GIB}
    profile: EncoderProfile | None = info["profile"]
    if profile is not None:
        parts["activation.encoder_profile_gib"] = profile.peak_bytes / GIB
        parts["activation.encoder_cache_gib"] = profile.cache_bytes / GIB
    return parts


def _mm_assumptions(
    vision: VisionSpec,
    settings: Settings,
    stage_info: list[dict[str, Any]],
    loaded: bool,
    tp: int,
    data_mode: bool,
) -> list[str]:
    limits = settings.limit_mm_per_prompt
    if not loaded:
        return [
            f"vision tower ({vision.family}): not built, --limit-mm-per-prompt is 0 for "
            f"{' and '.join(vision.modalities)} (vLLM's _mark_tower_model)"
        ]
    lines = [
        f"vision tower ({vision.family}, {vision.depth} blocks x {vision.hidden} hidden): "
        + (
            "whole on every rank (--mm-encoder-tp-mode data)"
            if data_mode
            else (f"linears split over TP={tp}, norms/embeddings replicated" if tp > 1 else "on the rank")
        )
        + ", on every PP stage"
    ]
    profile: EncoderProfile | None = stage_info[0]["profile"]
    if settings.skip_mm_profiling:
        lines.append("encoder profile: skipped (--skip-mm-profiling); the encoder's activations are not reserved")
    elif profile is not None:
        pixels = ""
        if vision.family in QWEN_FAMILIES:
            pixels = f" (max_pixels {vision.image_max_pixels:,} from {vision.pixels_source})"
        lines.append(
            f"encoder profile: {profile.items} dummy {profile.modality} item(s) of {profile.tokens_per_item:,} tokens"
            f"{pixels} -> {profile.patches:,} ViT patches in one forward, encoder budget {profile.budget:,} tokens;"
            " peak approximated from the eager ViT block (flash-style attention, no seq x seq scores)"
        )
        lines.append(
            f"encoder cache: the {profile.items} x {profile.tokens_per_item:,} output embeddings stay alive through"
            " the language model's dummy forward (profile_run's encoder_cache); shrink with --limit-mm-per-prompt"
            + (" or --mm-processor-kwargs max_pixels" if vision.family in QWEN_FAMILIES else "")
        )
    elif limits:
        lines.append("encoder profile: nothing to profile with these --limit-mm-per-prompt counts")
    return lines


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
    moe = moe_parallel(spec, settings) if spec.is_moe else None
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
    vision = _vision(spec, settings)
    loaded = vision is not None and tower_loaded(vision, settings.limit_mm_per_prompt)
    data_mode = vision is not None and settings.mm_encoder_tp_mode == "data" and vision.supports_encoder_tp_data
    sd = options.resolve_speculative(spec, settings)
    lora_head = settings.enable_lora and spec.model_type in options.LORA_EMBEDDING_MODEL_TYPES
    if lora_head and spec.vocab_size > options.LORA_MAX_VOCAB:
        raise PlanError(
            "--enable-lora",
            f"vLLM's LoRA logits layer takes a vocabulary of at most {options.LORA_MAX_VOCAB:,}, "
            f"{spec.name} has {spec.vocab_size:,}",
            "serve it without LoRA",
        )
    query_len = options.decode_query_len(sd)
    draft_tok = options.draft_kv_token_bytes(spec, sd, tp, kv_b) if sd and sd.draft_layers else 0
    same_page = draft_tok == _kv_layer_bytes(spec, tp, kv_b, acct)
    pooled_drafts = sd.draft_layers if sd and sd.draft_layers and same_page else 0
    layout = _kv_layout(spec, tp, kv_b, block, acct, db, settings, tokens, mml, smallest.kind, pooled_drafts)
    block = layout.block
    draft_ids = list(range(spec.num_layers, spec.num_layers + pooled_drafts))

    stage_info: list[dict[str, Any]] = []
    start = 0
    for stage, count in enumerate(partition):
        layers = list(range(start, start + count))
        start += count
        dev = stage_devices[stage]
        first, last = stage == 0, stage == pp - 1
        parts = _stage_parts(spec, layers, first, last, tp, ep, quant, db, pp, acct, moe)
        if vision is not None:
            # vLLM builds the tower on every PP rank (the model classes have no PP check).
            parts.vision = _vision_weight_bytes(spec, vision, tp, db, data_mode) if loaded else 0.0
        weights = (
            parts.embed * ratios.get("embed", 1.0)
            + parts.head * ratios.get("head", 1.0)
            + parts.layer * ratios.get("layer", 1.0)
            + parts.vision
            + parts.other
        )
        moe_parts = _moe_parts(
            spec, layers, tp, ep, tokens, quant, db, acct, moe, ratios.get("layer", 1.0), settings.enable_eplb
        )
        weights += moe_parts.get("weights.eplb_buffers_gib", 0.0) * GIB
        extra: dict[str, float] = dict(moe_parts)
        lora = options.lora_bytes(spec, layers, first, last, tp, ep, settings, db)
        # The drafter lives on the last PP rank only (GPUModelRunner: is_last_rank).
        draft = options.draft_weight_bytes(spec, sd, tp, ep, db, tokens) if sd and last else 0.0
        offload = options.offloaded_bytes(settings, parts.layer * ratios.get("layer", 1.0))
        weights += lora + draft - offload
        if settings.enable_lora:
            extra["weights.lora_gib"] = lora / GIB
        if sd is not None:
            extra["weights.draft_gib"] = draft / GIB
        if settings.cpu_offload_gb:
            extra["weights.cpu_offloaded_gib"] = offload / GIB
        draft_kv = sd.draft_layers if sd and last else 0
        # DeepSeek V3.2: DeepseekV2Model allocates topk_indices_buffer (int32, max_num_batched_tokens
        # x index_topk) with the weights, on every stage.
        weights += tokens * spec.index_topk * 4
        act = _activation_bytes(spec, layers, last, tp, ep, tokens, min(seqs, tokens), db, acct, moe)
        profile: EncoderProfile | None = None
        if vision is not None and loaded and not settings.skip_mm_profiling and acct.engine == "v1":
            profile = encoder_profile(
                vision,
                limits=settings.limit_mm_per_prompt,
                max_model_len=mml,
                max_num_batched_tokens=tokens,
                max_num_seqs=seqs,
                tp=tp,
                data_mode=data_mode,
                db=db,
            )
            if profile is not None:
                # profile_run: the encoder forward, then its outputs stay in encoder_cache
                # through the LM dummy forward and the dummy sampler.
                act = max(profile.peak_bytes, profile.cache_bytes + act)
        nt_in, nt_out = _non_torch_bytes(tp, pp, dev, acct, nvlink, moe)
        graphs = _cuda_graph_bytes(
            spec, layers, seqs, tokens, settings, dev, query_len, draft_kv, options.lora_graph_cases(settings)
        )
        budget = dev.total_gib * GIB * settings.gpu_memory_utilization
        available = budget - weights - act - nt_in - (graphs if acct.graphs_in_budget else 0.0)
        if settings.kv_cache_memory_bytes is not None:
            available = float(settings.kv_cache_memory_bytes)
        per_block = layout.bytes_per_block(layers + (draft_ids if last else []))
        if draft_kv and not same_page:
            # A draft with another page size: one group of UniformTypeKVCacheSpecs, whose block
            # is the sum of every layer's page (exact for one group, approximate for hybrids).
            per_block += draft_kv * draft_tok * block
        if sd is not None:
            extra["kv.draft_layers"] = float(draft_kv)
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
                "parts": extra,
                "draft_tok_bytes": draft_kv * draft_tok,
                "vision": parts.vision if vision is not None else 0.0,
                "profile": profile,
            }
        )

    num_blocks = min(s["blocks"] for s in stage_info)
    # Every stage projects the same global groups (get_kv_cache_configs), so a request
    # needs the same blocks in each stage's pool; stages share the block count.
    need = layout.blocks_per_request(mml, acct)
    conc = num_blocks / need if need else 0.0
    kv_tokens = _reported_tokens(layout, num_blocks, conc, mml, acct)
    fit_len = min(_max_len_fit(layout, s["blocks"], mml_cap, acct) for s in stage_info)
    reserve = 1 if acct.null_block_reserved else 0
    kv_parts, kv_assumptions = _kv_parts(spec, layout, tp, acct, mml)

    ranks: list[RankMemory] = []
    for stage, info in enumerate(stage_info):
        tok_bytes = layout.token_bytes * layout.attention_layers(info["layers"]) + info["draft_tok_bytes"]
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
                    parts={
                        **info["parts"],
                        **(_mm_parts(info) if vision is not None else {}),
                        **kv_parts(info["layers"]),
                    },
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
    elif num_blocks - reserve < need:
        fits = False
        missing = max((need + reserve - num_blocks) * s["per_block"] for s in stage_info) / GIB
        reason = (
            f"the KV cache holds {kv_tokens} tokens but one request of max_model_len={mml} needs "
            + (f"{need * block}" if len(layout.groups) == 1 else f"{need} blocks of its {len(layout.groups)} groups")
            + f" ({missing:.2f} GiB more); the largest max_model_len that fits is {fit_len}"
        )
    else:
        for info in stage_info:
            dev = info["device"]
            if dev.kind == "cpu":
                continue
            needed = info["budget"] + info["nt_out"]
            free = (dev.free_gib if dev.free_gib is not None else dev.total_gib) * GIB
            if needed > free:
                # request_memory (v1/worker/utils.py): vLLM refuses to start when the free memory
                # is below total x gpu_memory_utilization.
                fits = False
                most = math.floor((free - info["nt_out"]) / (dev.total_gib * GIB) * 100) / 100
                reason = (
                    f"gpu_memory_utilization {settings.gpu_memory_utilization} asks for "
                    f"{info['budget'] / GIB:.2f} GiB but only {(free - info['nt_out']) / GIB:.2f} GiB is free after "
                    f"the CUDA context and NCCL ({info['nt_out'] / GIB:.2f} GiB); lower it"
                    + (f" to {most:g} or less" if most > 0 else "")
                    + " or free the GPU (vLLM refuses to start: 'Free memory on device')"
                )
                break
            if settings.kv_cache_memory_bytes is not None:
                # Worker.determine_available_memory returns kv_cache_memory_bytes as it is
                # (no profiling-based sizing): the pool must fit next to what the profile run holds.
                used = info["weights"] + info["act"] + info["nt"] + info["graphs"] + num_blocks * info["per_block"]
                if used + info["nt_out"] > free:
                    fits = False
                    reason = (
                        f"kv_cache_memory_bytes {settings.kv_cache_memory_bytes:,} with the weights and overheads "
                        f"needs {(used + info['nt_out']) / GIB:.2f} GiB, {free / GIB:.2f} GiB is free "
                        "(vLLM skips profiling-based sizing and runs out of memory); lower it"
                    )
                    break
    mm_assumptions = _mm_assumptions(vision, settings, stage_info, loaded, tp, data_mode) if vision is not None else []
    if acct.graphs_in_budget is False and any(s["graphs"] > 0 for s in stage_info):
        notes.append("CUDA graphs are captured after the KV cache is sized (outside the budget)")
    assumptions = options.assumptions(spec, settings, sd)
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
        assumptions=_moe_assumptions(spec, settings, moe, tokens, nvlink, smallest)
        + mm_assumptions
        + assumptions
        + kv_assumptions
        + _llama4_assumptions(spec, layout, settings),
        mm_serve_args=_mm_serve_args(settings) if spec.vision is not None or spec.vision_params else [],
        option_args=options.serve_args(settings),
    )


def _llama4_assumptions(spec: ModelSpec, layout: _KvLayout, settings: Settings) -> list[str]:
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
        if any(g.kind == "chunked" for g in layout.groups):
            how = (
                f"hold at most attention_chunk_size + {layout.in_flight:,} in-flight tokens per request and "
                "chunked group (ChunkedLocalAttentionSpec.max_admission_blocks_per_request, hybrid KV cache manager)"
            )
        elif _chunked_as_full(spec, settings):
            how = (
                f"are allocated as full attention (hybrid KV cache manager off: {CHUNKED_HYBRID_ENV}=0, "
                "unify_hybrid_kv_cache_specs)"
            )
        else:
            how = "are allocated as full attention (one KV cache group)"
        lines.append(
            f"chunked local attention: {chunked} of {spec.num_layers} layers (the RoPE layers) attend within "
            f"{spec.attention_chunk_size}-token chunks and {how}; CUDA graphs piecewise only "
            "(the chunked backend supports no full graph)"
        )
    return lines
