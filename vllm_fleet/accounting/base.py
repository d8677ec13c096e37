"""The accounting's shared vocabulary: vLLM releases and which accounting each uses, the
constants vLLM's startup profile is measured with, and how MoE layers lie over the ranks.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20
CURRENT_VLLM = "0.32.0"

# Memory the CUDA context takes on every GPU before vLLM's snapshot (driver,
# kernels of torch / vLLM / FlashInfer loaded lazily): outside the budget but
# it has to be free, or startup fails with "Free memory on device ...".
CUDA_CONTEXT_GIB = 0.6
# NCCL over PCIe (no NVLink): per peer, 2 channels x (the Simple protocol's NCCL_BUFFSIZE of
# 4 MiB + the LL protocol's 512 KiB: 8 lines x 512 threads x 8 steps x 16 bytes; LL128 runs over
# NVLink only) = 9 MiB; per communicator, its own device structures (work FIFOs, channel and
# proxy state), 64 MiB. With the 0.1 GiB of cuBLAS workspaces the two communicators of a TP=2
# pair come to 0.24 GiB, against the 0.25 GiB of non-torch memory vLLM printed for two RTX 4090s
# (vllm-project/vllm issue 13061, V0; NCCL used its shared-memory transport there, GeForce cards
# having no P2P). Unmeasured beyond that pair: more PCIe ranks, P2P transport, aarch64 hosts (a
# 1 MiB default buffer there). The NVLink figures below (0.25 GiB a communicator, 0.35 GiB a
# peer: 16-32 channels, LL128, NVLS) are the measured ones.
NCCL_PCIE_PER_PEER_GIB = 2 * (4 + 0.5) / 1024
NCCL_PCIE_COMM_GIB = 64 / 1024
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
# Fused-MoE processed tokens in chunks of this size (VLLM_FUSED_MOE_CHUNK_SIZE) in the
# releases before 0.32; 0.32 has no such setting (FusedMoEKernel._fused_experts sizes the
# workspaces for all the tokens of the call, M_chunk = M_full).
FUSED_MOE_CHUNK = 16 * 1024
VOCAB_PAD = 64
# ParallelConfig.all2all_backend (the All2AllBackend literal of vllm/config/parallel.py);
# "naive" and "pplx" were removed and fall back to allgather_reducescatter (__post_init__).
DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"
ALL2ALL_BACKENDS = frozenset(
    {
        "naive", "pplx", "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
        "deepep_v2", "mori_high_throughput", "mori_low_latency", "moonep", "nixl_ep",
        "flashinfer_all2allv", "flashinfer_nvlink_two_sided", "flashinfer_nvlink_one_sided", "passthrough",
    }
)  # fmt: skip
# VLLM_DEEPEP_BUFFER_SIZE_MB: the NVLink buffer of DeepEP's deep_ep.Buffer (and its RDMA
# buffer across nodes) that DeepEPHTAll2AllManager / DeepEPLLAll2AllManager allocate.
DEEPEP_BUFFER_MIB = 1024
# EPLBConfig.window_size: steps of per-expert load EplbState.add_model records (int32).
EPLB_WINDOW = 1000


def parse_version(text: str) -> tuple[int, int]:
    """``"0.11.2"`` -> ``(0, 11)``; unknown text means the current release."""
    parts = text.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return parse_version(CURRENT_VLLM)


OLDEST_KNOWN_VLLM = "0.5.0"


def default_gpu_memory_utilization(version: str) -> float:
    """vLLM's own default for ``--gpu-memory-utilization`` in ``version``: 0.9 up to 0.19, 0.92 from
    0.20 on (``CacheConfig.gpu_memory_utilization`` in vllm/config/cache.py, read in the sdists of
    0.14, 0.17, 0.18, 0.19, 0.20, 0.23, 0.26 and 0.32 on PyPI)."""
    return 0.92 if parse_version(version) >= (0, 20) else 0.9


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
    # 0.32's fused MoE: workspaces for all the tokens of the call (no VLLM_FUSED_MOE_CHUNK_SIZE),
    # shaped as TritonExperts.workspace_shapes; older releases keep the planner's chunked rule.
    moe_unchunked: bool = False
    # Sliding-window and chunked groups reserve max_in_flight_tokens (VllmConfig's
    # max_concurrent_batches x max_num_batched_tokens) rather than one batch: from 0.26.0 (the
    # 0.25.0 sdist's max_admission_blocks_per_request still takes max_num_batched_tokens).
    in_flight_batches: bool = False
    # "GPU KV cache size" = int(max_concurrency x max_model_len) (get_kv_cache_capacity);
    # before: num_blocks // len(groups) x min block size (vllm issue 40691's 0.19 log). The
    # 0.20.0 sdist prints the old figure, 0.21.0 the new one.
    tokens_from_concurrency: bool = True
    # get_kv_cache_configs checks a request against available memory less one block (the
    # null block BlockPool holds back): from 0.29.0 (not in the 0.28.0 sdist).
    null_block_reserved: bool = False
    # Prefix caching on by default for hybrid (mamba, linear-attention) models:
    # ModelConfig.is_prefix_caching_supported says "hybrid" is supported from 0.26.0 (False in
    # the 0.19.0, 0.20.0, 0.22.0, 0.24.0, 0.25.0 and 0.25.1 sdists; True in 0.26.0, 0.28.0,
    # 0.30.0 and 0.32).
    hybrid_prefix_caching: bool = True
    # How prefix caching reaches mamba layers (MambaModelConfig.verify_and_update_config, and
    # MambaSpec.max_memory_usage_bytes): "off" (0.11: one block per request, prefix caching
    # disabled for mamba models), "all" (0.14: models with SupportsMambaPrefixCaching keep a
    # state per block; the others have prefix caching disabled), "all-or-align" (0.16 to 0.27:
    # those models "all", the others "align", 2 blocks), "align" (0.28 on). 0.12, 0.13 and 0.15
    # were not read: taken as their neighbours.
    mamba_prefix_caching: str = "align"
    # _get_kv_cache_groups_uniform_page_size: the groups take the largest bucket's layer count
    # when it is below this many times the smallest's, else the smallest's (padding layers fill
    # the last group of a bucket): 1.5 from 0.18.0, 1.25 in 0.12.0 to 0.17.0, never in 0.11.0
    # (0 here: always the smallest). Read in those sdists.
    group_max_ratio: float = 1.5

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
            moe_unchunked=rel >= (0, 32) and eng == "v1",
            in_flight_batches=rel >= (0, 26),
            tokens_from_concurrency=rel >= (0, 21),
            null_block_reserved=rel >= (0, 29),
            hybrid_prefix_caching=rel >= (0, 26),
            group_max_ratio=0.0 if rel < (0, 12) else 1.25 if rel < (0, 18) else 1.5,
            mamba_prefix_caching=(
                "off" if rel < (0, 14) else "all" if rel < (0, 16) else "all-or-align" if rel < (0, 28) else "align"
            ),
        )


@dataclass(frozen=True)
class MoeParallel:
    """How vLLM lays one instance's MoE layers over its ranks (``FusedMoEParallelConfig.make``)."""

    ep_size: int  # 1 without expert parallelism
    moe_tp: int  # ranks the expert weights are TP-sharded over: tp x dp without EP, 1 with EP
    global_experts: int  # routed experts + EPLB redundant experts (determine_expert_counts)
    local_experts: int  # experts on the rank holding the most (determine_expert_map)
    dispatch_ranks: int  # ranks whose tokens one rank's MoE layers compute (dp when dp > 1)
    all2all: str  # the all2all backend its kernels use, "" when there are none


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
