"""What one engine step of one vLLM instance costs on its hardware (a roofline per kernel class).

A step runs ``decodes`` sequences one token each and ``prefill`` prompt tokens (chunked
prefill, vLLM V1's default), all under ``max_num_batched_tokens``. Per GPU rank it costs:

* the linear layers: max(FLOPs / (peak x GEMM efficiency), weight bytes / (HBM x efficiency)),
  the FLOPs being 2 x the active parameters per token, the bytes the rank's weights (for a MoE,
  only the experts the step's tokens route to: E x (1 - (1 - k/E)^tokens));
* attention: prefill FLOPs 4 x heads x head_dim x tokens x (prefix + tokens/2) (causal), decode
  reads every sequence's KV cache (bytes per token x context);
* TP: two all-reduces per layer of tokens x hidden x 2 bytes, ring-costed
  latency + 2 (tp-1)/tp x bytes / link bandwidth; EP: a dispatch and a combine all-to-all of
  tokens x top-k x hidden per MoE layer; PP: a send of the hidden states per stage boundary;
* a fixed engine overhead per step and per sequence, and Python launches per layer when no CUDA
  graph covers the batch.

Per-stage costs are the whole model's over the stage's share of layers; the serving model
(:mod:`vllm_fleet.performance.serving`) composes stages into pipelines.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.memory import Estimate
from vllm_fleet.model.spec import ModelSpec
from vllm_fleet.performance import constants as C
from vllm_fleet.performance.hardware import Accelerator
from vllm_fleet.performance.workload import Calibration

ATTENTION_LAYERS = ("full", "sliding", "chunked", "parallel")


@dataclass(frozen=True)
class Links:
    """How the ranks of one instance talk: within a TP group, between PP stages, and for EP."""

    tp: str  # nvlink, pcie, network, cpu
    tp_gbps: float
    pp: str
    pp_gbps: float
    ep: str
    ep_gbps: float


@dataclass(frozen=True)
class StepCost:
    """One step's time and where it went (seconds)."""

    total: float
    compute: float
    memory: float
    comm: float
    overhead: float

    @property
    def bound(self) -> str:
        """What dominates: compute, memory, communication or overhead."""
        parts = {"compute": self.compute, "memory": self.memory, "communication": self.comm, "overhead": self.overhead}
        return max(parts, key=lambda k: parts[k])


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts of the model as the step's kernels see them (whole model, one copy)."""

    layers: int
    attention_layers: float  # layers with a KV cache read (sliding ones weighted by their window later)
    sliding_share: float
    window: int
    attn: float  # parameters of one layer's attention (or mixer)
    dense_mlp: float  # one dense layer's MLP
    dense_layers: int
    moe_layers: int
    expert: float  # one routed expert
    experts: int
    top_k: int
    shared: float  # shared experts and router of one MoE layer
    head: float  # lm_head
    embed: float
    q_width: float  # heads x head_dim (attention FLOPs)
    hidden: int


def model_shape(spec: ModelSpec) -> ModelShape:
    """Counts from config.json's values (the same ones the memory accounting reads)."""
    h = spec.hidden_size
    heads, kv, hd = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    if spec.kv_lora_rank:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = h * spec.q_lora_rank + spec.q_lora_rank * heads * qk if spec.q_lora_rank else h * heads * qk
        attn = q + h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        attn += spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim) + heads * spec.v_head_dim * h
        q_width = float(heads * qk)
    else:
        attn = h * hd * (heads + 2 * kv) + heads * hd * h
        q_width = float(heads * hd)
    layers = spec.num_layers
    types = spec.layer_types or ("full",) * layers
    attention = sum(1 for t in types if t in ATTENTION_LAYERS)
    sliding = sum(1 for t in types if t in ("sliding", "chunked"))
    window = spec.sliding_window or spec.attention_chunk_size
    if spec.is_moe:
        dense_layers = min(spec.first_dense_layers, layers)
        step = max(spec.moe_layer_step, 1)
        moe_layers = (layers - dense_layers) // step
        dense_layers = layers - moe_layers
        width = spec.moe_latent_size or h
        expert = 3.0 * width * spec.moe_intermediate_size
        shared_inter = spec.shared_expert_intermediate_size or spec.num_shared_experts * spec.moe_intermediate_size
        shared = 3.0 * h * shared_inter + h * spec.num_experts
    else:
        dense_layers, moe_layers, expert, shared = layers, 0, 0.0, 0.0
    return ModelShape(
        layers=layers,
        attention_layers=float(attention),
        sliding_share=sliding / max(attention, 1),
        window=window,
        attn=float(attn),
        dense_mlp=3.0 * h * spec.intermediate_size,
        dense_layers=dense_layers,
        moe_layers=moe_layers,
        expert=expert,
        experts=spec.num_experts,
        top_k=max(spec.num_experts_per_tok, 1) if spec.is_moe else 0,
        shared=shared,
        head=float(spec.vocab_size * h),
        embed=0.0 if spec.tie_word_embeddings else float(spec.vocab_size * h),
        q_width=q_width,
        hidden=h,
    )


def compute_dtype(spec: ModelSpec, est: Estimate, acc: Accelerator) -> str:
    """The dtype the GEMMs run in: fp8 / int8 activations where the method quantizes them and the
    GPU has the units, fp4 on Blackwell, else the model's 16-bit type (weight-only formats such as
    AWQ, GPTQ and Marlin's fp8-on-Ampere dequantize into bf16 GEMMs)."""
    method = (est.quantization or (spec.quant.method if spec.quant else "") or "").lower()
    bits = spec.quant.weight_bits if spec.quant else (8 if "fp8" in method else 16)
    if "fp4" in method or (bits == 4 and method in ("modelopt_fp4", "nvfp4")):
        wanted = "fp4"
    elif "fp8" in method or method in ("modelopt", "fbgemm_fp8", "ptpc_fp8"):
        wanted = "fp8"
    elif bits == 8 and method in ("compressed-tensors", "w8a8", "int8"):
        wanted = "fp8" if "fp8" in acc.tflops else "int8"
    else:
        wanted = "bf16"
    return acc.compute_dtype(wanted)


class StepModel:
    """Step costs of one instance: ``tp`` x ``pp`` ranks (``dp`` ranks each this, for DP/EP)."""

    def __init__(
        self,
        spec: ModelSpec,
        est: Estimate,
        acc: Accelerator,
        arch: str,
        links: Links,
        cpu: bool = False,
        imbalance: float = 1.0,
        calibration: Calibration | None = None,
    ) -> None:
        self.calibration = calibration or Calibration()
        self.spec, self.est, self.acc, self.links, self.cpu = spec, est, acc, links, cpu
        self.imbalance = imbalance
        self.host_speed = C.HOST_SPEED.get(arch, 0.8)
        # What a request spends outside the engine's steps before its first token.
        self.request_overhead = (C.CPU_REQUEST_OVERHEAD_S if cpu else C.REQUEST_OVERHEAD_S) / self.host_speed
        self.shape = model_shape(spec)
        self.tp = est.tensor_parallel_size
        self.pp = est.pipeline_parallel_size
        self.dp = max(est.data_parallel_size, 1)
        self.ep = self.tp * self.dp if est.enable_expert_parallel else 1
        self.dtype = compute_dtype(spec, est, acc)
        eff = C.GEMM_EFFICIENCY.get("cpu" if cpu else arch, 0.6)
        if self.dtype != "bf16":
            eff *= C.LOW_PRECISION_GEMM_SCALE
        self.gemm_flops = acc.peak(self.dtype) * 1e12 * eff
        self.attn_flops = acc.peak("bf16") * 1e12 * C.PREFILL_ATTENTION_EFFICIENCY
        self.hbm = acc.hbm_gbps * 1e9 * C.HBM_EFFICIENCY
        self.kv_bw = acc.hbm_gbps * 1e9 * C.KV_READ_EFFICIENCY
        s = self.shape
        # One copy's parameters of each class, per GPU rank (TP shards everything; EP spreads
        # whole experts over the TP x DP ranks instead).
        per_rank_dense = (s.attn * s.layers + s.dense_mlp * s.dense_layers + s.shared * s.moe_layers) / self.tp
        self.experts_per_rank = s.experts / self.ep if s.experts else 0.0
        expert_rank = s.expert / (1 if self.ep > 1 else self.tp)
        params = per_rank_dense + s.moe_layers * self.experts_per_rank * expert_rank + (s.head + s.embed) / self.tp
        rank_bytes = sum(r.weights_gib for r in est.ranks) * GIB / max(len(est.ranks), 1) * self.pp
        # Bytes per parameter as the memory accounting counted them (quantization, scales).
        self.bpp = rank_bytes / params if params > 0 else 2.0
        self.dense_bytes = per_rank_dense * self.bpp
        self.expert_bytes = expert_rank * self.bpp
        self.head_bytes = s.head / self.tp * self.bpp
        self.kv_token_bytes = float(est.kv_bytes_per_token) * self.pp  # the whole model's, per TP rank
        self.act_bytes = 2.0

    # -- the parts ----------------------------------------------------------------------

    def _gemm(self, flops: float, weight_bytes: float, rows: float) -> tuple[float, float]:
        # GPU tensor-core tiles have a minimum height; a CPU GEMM has no such floor.
        padded = 1.0 if self.cpu else max(rows, C.GEMM_MIN_ROWS) / max(rows, 1.0)
        return flops * padded / self.gemm_flops, weight_bytes / self.hbm

    def _allreduce(self, tokens: float) -> float:
        if self.tp == 1:
            return 0.0
        link = self.links.tp
        size = tokens * self.shape.hidden * self.act_bytes
        bw = self.links.tp_gbps * 1e9 * C.LINK_EFFICIENCY[link]
        one = C.ALLREDUCE_LATENCY_S[link] + 2 * (self.tp - 1) / self.tp * size / bw
        return 2 * self.shape.layers * one

    def _all2all(self, tokens: float) -> float:
        if self.ep == 1 or not self.shape.moe_layers:
            return 0.0
        link = self.links.ep
        size = tokens * self.shape.top_k * self.shape.hidden * self.act_bytes * (self.ep - 1) / self.ep
        bw = self.links.ep_gbps * 1e9 * C.LINK_EFFICIENCY[link]
        return 2 * self.shape.moe_layers * (C.ALL2ALL_LATENCY_S + size / bw)

    def experts_touched(self, tokens: float) -> float:
        """Experts of one MoE layer on this rank that at least one of ``tokens`` routes to."""
        s = self.shape
        if not s.experts:
            return 0.0
        routed = tokens * (self.dp if self.ep > 1 else 1)  # EP: every DP rank's tokens reach the experts
        share = 1.0 - float((1.0 - s.top_k / s.experts) ** routed)
        return self.experts_per_rank * share

    def step(self, decodes: float, prefill: float, context: float, prefix: float = 0.0) -> StepCost:
        """One step of one DP rank over all its PP stages (one stage's time is 1/pp of the layer
        parts, plus the overheads): ``decodes`` sequences at mean ``context`` tokens, ``prefill``
        new prompt tokens after ``prefix`` tokens of their request already in the cache."""
        s = self.shape
        tokens = decodes + prefill
        sampled = decodes + (1.0 if prefill else 0.0)
        active = s.attn * s.layers + s.dense_mlp * s.dense_layers + s.shared * s.moe_layers
        flops = 2.0 * tokens * active / self.tp + 2.0 * sampled * s.head / self.tp
        weight_bytes = self.dense_bytes + self.head_bytes
        lin_c, lin_m = self._gemm(flops, weight_bytes, tokens)
        if s.moe_layers:
            # The routed experts: their tokens' FLOPs and the touched experts' bytes, at the fused
            # MoE kernels' lower efficiency.
            routed = 2.0 * tokens * s.top_k * s.expert * s.moe_layers / (self.tp if self.ep == 1 else 1)
            if self.ep > 1:
                routed = routed * self.dp / self.ep
            moe_bytes = s.moe_layers * self.experts_touched(tokens) * self.expert_bytes
            moe_c, moe_m = self._gemm(routed, moe_bytes, tokens)
            eff = C.moe_efficiency(self.spec.moe_intermediate_size)
            lin_c += moe_c / eff
            lin_m += moe_m / eff
        # Attention: the prefill's causal FLOPs, the decodes' KV reads (a sliding layer reads its window).
        attn_layers = s.attention_layers
        heads_width = s.q_width / self.tp
        span = prefix + prefill / 2.0
        attn_c = 4.0 * heads_width * prefill * span * attn_layers / self.attn_flops if prefill else 0.0
        read = context * (1 - s.sliding_share) + min(context, s.window or context) * s.sliding_share
        kv_bytes = decodes * read * self.kv_token_bytes
        if prefill:
            kv_bytes += prefix * self.kv_token_bytes  # the cached prefix is read once by the chunk
        attn_m = kv_bytes / self.kv_bw
        attn_c += 4.0 * heads_width * decodes * read * attn_layers / self.attn_flops
        compute = lin_c + attn_c
        memory = lin_m + attn_m
        work = max(lin_c, lin_m) + max(attn_c, attn_m)
        comm = self._allreduce(tokens) + self._all2all(tokens)
        if self.pp > 1:
            link = self.links.pp
            hops = (self.pp - 1) * (
                C.P2P_LATENCY_S[link]
                + tokens * s.hidden * self.act_bytes / (self.links.pp_gbps * 1e9 * C.LINK_EFFICIENCY[link])
            )
            comm += hops
        fixed, launches = self._overhead(decodes, tokens)
        # Kernel launches from Python overlap the GPU's work: the step takes the longer of the two.
        busy = max(work + comm, launches)
        total = busy + fixed
        if self.pp > 1:
            # One micro-batch's pass; the engine's serial part bounds the pipeline's cycle.
            total = max(total * self.imbalance / C.PP_EFFICIENCY, self.pp * fixed)
        total *= self.calibration.step_time
        overhead = total - (work + comm)
        return StepCost(total, compute, memory, comm, overhead)

    def _overhead(self, seqs: float, tokens: float) -> tuple[float, float]:
        """(fixed time, kernel-launch time) of one step."""
        s = self.shape
        if self.cpu:
            return C.CPU_STEP_OVERHEAD_S + C.CPU_LAYER_S * s.layers + C.CPU_SEQ_OVERHEAD_S * seqs, 0.0
        eager = self.est.enforce_eager or tokens > C.CUDA_GRAPH_MAX_BATCH
        launches = C.EAGER_LAYER_S * s.layers if eager else 0.0
        fixed, per_seq = C.engine_overhead(self.est.vllm_version)
        return (fixed + per_seq * seqs) / self.host_speed, launches
