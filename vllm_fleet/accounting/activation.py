"""What one profile forward pass allocates beside the weights: activations (MLP, fused MoE,
the sampler), all2all buffers, non-torch memory and the CUDA graph pool.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.accounting.base import (
    CUDA_CONTEXT_GIB,
    CUDA_GRAPH_MIB_PER_GRAPH_LAYER,
    DEEPEP_BUFFER_MIB,
    DEFAULT_ALL2ALL_BACKEND,
    EPLB_WINDOW,
    FUSED_MOE_CHUNK,
    GIB,
    MIB,
    NCCL_PCIE_COMM_GIB,
    NCCL_PCIE_PER_PEER_GIB,
    VOCAB_PAD,
    Accounting,
    MoeParallel,
    _ceil_div,
)
from vllm_fleet.accounting.parts import (
    _routed_expert_bytes,
)
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.quantspec import QuantSpec
from vllm_fleet.model.spec import ModelSpec

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
    # The experts' own width (Nemotron-H's latent MoE runs them in moe_latent_size).
    k = spec.moe_latent_size or h
    shard = moe.moe_tp if moe is not None else (1 if ep > 1 else tp)
    inter = spec.moe_intermediate_size / shard
    topk = max(spec.num_experts_per_tok, 1)
    gather = moe.dispatch_ranks if moe is not None else 1

    def workspace(m: int) -> float:
        if acct.moe_unchunked:
            return max(m * topk * max(inter, k), m * k) * db + m * topk * max(2 * inter, k) * db
        # fused_moe caches (gate_up out, activation out, per-expert out) for one chunk.
        return min(m, FUSED_MOE_CHUNK) * topk * (3 * inter + k) * db

    def layer(m: int) -> float:
        # Workspaces, router logits (fp32) and the summed output of the local tokens; the
        # gathered hidden states and top-k ids / weights (int32 + fp32) when tokens came in.
        total = workspace(m) + m * spec.num_experts * 4 + tokens * h * db
        if m > tokens:
            # Gathered hidden states: in the latent width for a latent MoE (vLLM applies
            # fc1_latent_proj before the dispatch, apply_routed_input_transform).
            total += m * k * db + m * topk * 8
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
        # Two communicators (torch.distributed + PyNccl) per group; buffers per peer grow
        # with the group size. NCCL keeps, per channel and peer, a Simple buffer of
        # NCCL_BUFFSIZE (4 MiB) and an LL one, plus LL128's over NVLink; NVLink rings run
        # 16-32 channels and NVLS adds its own (the NVLink figures: measured), PCIe rings 2
        # (NCCL_PCIE_PER_PEER_GIB) beside a smaller communicator of its own.
        per_peer = 0.35 * GIB if nvlink else NCCL_PCIE_PER_PEER_GIB * GIB
        comm = 0.25 * GIB if nvlink else NCCL_PCIE_COMM_GIB * GIB
        nccl = 2 * (comm + per_peer * (tp - 1)) if tp > 1 else 0.0
        if pp > 1:
            nccl += 0.2 * GIB
        # Custom all-reduce IPC buffers: CustomAllreduce refuses more than two PCIe-only GPUs
        # (not fully connected), so without NVLink only a pair keeps them, and GPUs without
        # peer-to-peer access none (_can_p2p).
        if tp > 1 and (nvlink or (tp == 2 and device.p2p)):
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
        if not device.p2p:
            state = "off (no peer-to-peer access between the GPUs: GeForce cards, or GPUs on different nodes; _can_p2p)"
        elif tp > 2:
            state = "off (CustomAllreduce: more than two PCIe-only GPUs)"
        else:
            state = "kept (two GPUs)"
        lines.append(f"PCIe without NVLink: custom all-reduce {state}; NCCL buffers outside the budget")
    return lines
