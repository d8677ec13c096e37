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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vllm_fleet.accounting import options, runner, unified
from vllm_fleet.accounting.activation import (
    _activation_bytes,
    _cuda_graph_bytes,
    _moe_assumptions,
    _moe_parts,
    _non_torch_bytes,
)
from vllm_fleet.accounting.base import (
    DEFAULT_ALL2ALL_BACKEND,
    GIB,
    Accounting,
    MoeParallel,
    _ceil_div,
    parse_version,
)
from vllm_fleet.accounting.kv import (
    _kv_layout,
    _kv_parts,
    _max_len_fit,
    _reported_tokens,
    llama4_assumptions,
)
from vllm_fleet.accounting.multimodal import (
    EncoderProfile,
    encoder_profile,
    tower_loaded,
)
from vllm_fleet.accounting.parts import (
    _file_ratios,
    _kv_layer_bytes,
    _stage_parts,
)
from vllm_fleet.accounting.settings import LIMITS, Device, Settings
from vllm_fleet.accounting.towers import (
    _mm_assumptions,
    _mm_parts,
    _vision,
    _vision_weight_bytes,
    gemma4_encoder_profile,
    param_tower_assumptions,
    param_tower_bytes,
)
from vllm_fleet.accounting.weights_format import weights_format
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import DTYPE_BYTES, ModelSpec
from vllm_fleet.schema import serve_args


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
    # The vllm serve flags of the declared options planned with (schema.serve_args: LoRA,
    # --speculative-config, --enforce-eager...), rendered into the plan's argv.
    option_args: list[str] = field(default_factory=list)
    # The environment this accounting needs vLLM to start with (unified.launch_env).
    launch_env: dict[str, str] = field(default_factory=dict)

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
        if self.launch_env:
            data["launch_env"] = self.launch_env
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
        tokens = min(tokens, seqs * max_model_len) if not settings.max_num_batched_tokens else tokens
        # EngineArgs: an unset max_num_seqs is never above the batched tokens.
        return (seqs if settings.max_num_seqs else min(seqs, tokens)), tokens
    if acct.engine == "v0":
        seqs = seqs or 256
        if tokens is None:
            # V0 turned chunked prefill on by default above 32K context.
            tokens = 2048 if max_model_len > 32768 else max(max_model_len, 2048)
        return seqs, tokens
    # vLLM leaves out the A100 by name only ("a100" not in the device name): an A800 is large.
    large = device.total_gib >= 70 and "a100" not in device.name.lower()
    # EngineArgs.get_batch_defaults: the 160 GiB tier came in 0.28 (read in the sdists of 0.14,
    # 0.20, 0.26, 0.27 without it, 0.28 to 0.32 with it); below it the 70 GiB tier.
    if device.total_gib >= 160 and parse_version(settings.vllm_version) >= (0, 28):
        default_tokens, default_seqs = 16384, 1024
    elif large:
        default_tokens, default_seqs = 8192, 1024
    else:
        default_tokens, default_seqs = 2048, 256
    seqs = seqs or default_seqs
    if tokens is None:
        tokens = min(default_tokens, seqs * max_model_len)
    if not settings.max_num_seqs:
        seqs = min(seqs, tokens)  # EngineArgs: an unset max_num_seqs is lowered to the batched tokens
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
    otherwise every rank is ``device``. An unset ``gpu_memory_utilization`` is vLLM's default
    for the release, lowered on idle GPUs to the most that starts where the memory left after
    vLLM's own CUDA context and NCCL is below it (vLLM would refuse to start with its default
    there); the plan renders the value it planned with, and says so in a note.
    """
    settings = settings or Settings()
    settings.validate()
    est, most = _estimate(spec, device, settings, devices_per_stage=devices_per_stage, nvlink=nvlink)
    # Only for idle GPUs, where vLLM's own context and NCCL are what the default leaves no room for,
    # and for unified memory, which the host always shares; memory other processes hold on a
    # discrete GPU (gpu_facts' free memory) is refused with the figure instead.
    stages = devices_per_stage or [device]
    idle = all(d.free_gib is None or d.unified_memory for d in stages)
    if settings.gpu_memory_utilization is None and idle and most is not None and 0 < most < settings.utilization:
        lowered = replace(settings, gpu_memory_utilization=most)
        est, _ = _estimate(spec, device, lowered, devices_per_stage=devices_per_stage, nvlink=nvlink)
        held = (
            "the host's memory the OS and vLLM's own processes leave (unified memory) after the CUDA context and NCCL"
            if any(d.unified_memory for d in stages)
            else "the GPUs hold free after the CUDA context and NCCL"
        )
        est.notes.append(
            f"gpu_memory_utilization {most:g}, not vLLM {settings.vllm_version}'s default {settings.utilization:g}: "
            f"the default asks for more than {held} (vLLM would refuse to start)"
        )
    return est


def _estimate(
    spec: ModelSpec,
    device: Device,
    settings: Settings,
    *,
    devices_per_stage: list[Device] | None,
    nvlink: bool,
) -> tuple[Estimate, float | None]:
    """:func:`estimate` with ``settings`` as given, and the most gpu_memory_utilization that starts
    (None on CPUs)."""
    if settings.draft_spec is None and settings.speculative_config:
        # The draft model an EAGLE / draft_model config names, loaded like the model.
        settings = replace(settings, draft_spec=options.draft_spec_for(settings.speculative_config))
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
    # SchedulerConfig (vllm/config/scheduler.py, 0.32) refuses to start then: this layout does not
    # fit (another GPU's defaults may). Not modelled: models without chunked prefill (encoder-only
    # or MEAN/CLS pooling), whose default batch vLLM raises to the length.
    batch_refusal = (
        f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs}) "
        f"(vLLM refuses to start); raise --max-num-batched-tokens to {seqs} or more, or lower "
        f"--max-num-seqs to {tokens} or less"
        if acct.engine == "v1" and tokens < seqs
        else ""
    )
    quant = weights_format(spec, settings.quantization)
    db = _dtype_bytes(spec, settings, smallest)
    kv_b = _kv_dtype_bytes(settings, db)
    if (
        spec.model_type == "glm_moe_dsa"
        and settings.kv_cache_dtype == "auto"
        and smallest.kind == "cuda"
        and smallest.compute_capability // 10 == 10
        and acct.engine == "v1"
    ):
        # GlmMoeDsaForCausalLM.verify_and_update_config: an auto KV cache is fp8_e4m3 on SM10x.
        kv_b = 1
        notes.append("GLM-5 on SM10x: vLLM takes an fp8 KV cache for kv_cache_dtype auto (GlmMoeDsaForCausalLM)")
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
    loaded = vision is not None and tower_loaded(vision, settings.mm_limits)
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

    # Model Runner V2 estimated no graphs up to 0.28 (runner.py): they come on top of the budget there.
    v2_zero = runner.v2_without_graph_estimate(spec, settings, quant is not None, sd.method if sd else None)
    release_graphs = acct.graphs_in_budget and not v2_zero
    graphs_on = unified.graphs_in_budget(release_graphs, stage_devices, settings.estimate_cudagraphs)
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
        elif spec.tower_params and parts.vision:
            parts.vision = param_tower_bytes(spec, settings.mm_limits, db)
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
        draft = options.draft_weight_bytes(spec, sd, tp, ep, db, tokens, quant) if sd and last else 0.0
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
                limits=settings.mm_limits,
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
        if vision is None and spec.gemma4_vision and acct.engine == "v1":
            profile = gemma4_encoder_profile(spec, settings, (mml, tokens, seqs), dev, weights + nt_in + nt_out, db)
            act = max(profile.peak_bytes, profile.cache_bytes + act) if profile is not None else act
        graphs = _cuda_graph_bytes(
            spec, layers, seqs, tokens, settings, dev, query_len, draft_kv, options.lora_graph_cases(settings)
        )
        budget = dev.total_gib * GIB * settings.utilization
        available = budget - weights - act - nt_in - (graphs if graphs_on else 0.0)
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
        tok_bytes = layout.token_bytes_of(info["layers"]) + info["draft_tok_bytes"]
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
            f"{worst['device'].total_gib:.2f} GiB x {settings.utilization})"
        )
    elif num_blocks - reserve < need:
        fits = False
        missing = max((need + reserve - num_blocks) * s["per_block"] for s in stage_info) / GIB
        reason = (
            f"the KV cache holds {kv_tokens} tokens but one request of max_model_len={mml} needs "
            + (f"{need * block}" if len(layout.groups) == 1 else f"{need} blocks of its {len(layout.groups)} groups")
            + f" ({missing:.2f} GiB more); the largest max_model_len that fits is {fit_len}"
        )
    # request_memory (v1/worker/utils.py): vLLM refuses to start when the free memory is below
    # total x gpu_memory_utilization; the most it starts with, over the stages.
    start_limits = [
        unified.start_limit(s["device"], s["nt_out"])
        for s in stage_info
        if s["device"].kind != "cpu" and s["device"].total_gib > 0
    ]
    if worst["available"] > 0 and num_blocks - reserve >= need:
        for info in stage_info:
            dev = info["device"]
            if dev.kind == "cpu":
                continue
            needed = info["budget"] + info["nt_out"]
            free = unified.startup_free_bytes(dev)
            if needed > free:
                fits = False
                most = unified.start_limit(dev, info["nt_out"])
                held = " (unified memory: the OS and vLLM's host processes hold the rest)" if dev.unified_memory else ""
                reason = (
                    f"gpu_memory_utilization {settings.utilization} asks for "
                    f"{info['budget'] / GIB:.2f} GiB but only {(free - info['nt_out']) / GIB:.2f} GiB is free after "
                    f"the CUDA context and NCCL ({info['nt_out'] / GIB:.2f} GiB){held}; lower it"
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
    if batch_refusal:
        fits, reason = False, batch_refusal
    mm_assumptions = (
        _mm_assumptions(vision, settings, stage_info, loaded, tp, data_mode)
        if vision is not None
        else param_tower_assumptions(spec, settings.mm_limits)
    )
    if not graphs_on and any(s["graphs"] > 0 for s in stage_info):
        why = f" (vLLM {settings.vllm_version}'s Model Runner V2 estimates none)" if v2_zero else ""
        notes.append(f"CUDA graphs are captured after the KV cache is sized (outside the budget){why}")
    assumptions = options.assumptions(spec, settings, sd)
    est = Estimate(
        model=spec.name,
        device=device.name,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        enable_expert_parallel=ep > 1,
        gpu_memory_utilization=settings.utilization,
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
        + llama4_assumptions(spec, layout, settings)
        + unified.assumptions(
            smallest,
            settings.vllm_version,
            unified.graphs_assumption(release_graphs, graphs_on, max(s["graphs"] for s in stage_info) / GIB),
        ),
        launch_env=unified.launch_env(release_graphs, graphs_on),
        option_args=serve_args(settings, multimodal=spec.vision is not None or bool(spec.vision_params)),
    )
    return est, min(start_limits) if start_limits else None
