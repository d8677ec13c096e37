"""What hardware actually reaches of its peaks, and vLLM's fixed costs: each constant named,
with what it was calibrated on.

The planner profiles no GPU. These fractions come from published kernel measurements and were
then checked against the public end-to-end measurements of ``tests/datasets/vllm_perf_public.yaml``
(``make bench-perf``): the figure is the published one unless the note says it was moved, and
by how much. ``tests/gpu/run.sh`` measures the same fractions with PyTorch on a lent GPU.
"""

from __future__ import annotations

# --- GEMMs -------------------------------------------------------------------------------
# Fraction of the dense peak a large bf16 GEMM reaches, per architecture. cuBLAS reaches about
# 700 of 989 TFLOP/s on an H100 SXM for transformer shapes (NVIDIA's "GPU Performance
# Background" guide and Transformer Engine's published GEMM sweeps), about 230-250 of 312 on
# an A100 (MLPerf-era cuBLAS sweeps); GeForce/Ada parts run at lower clocks under load.
# Inside a serving step the GEMMs are smaller (a TP shard's columns, a mixed batch of a few
# thousand rows) and share the step with norms, rotary and sampling: the public dataset's
# compute-bound runs put the step's whole linear part near 55 % of peak on H100 and 60 % on A100
# (moved from cuBLAS's large-GEMM 0.70 / 0.75: GPUStack's Qwen3 and Lambda's A100 ITLs).
GEMM_EFFICIENCY: dict[str, float] = {
    "hopper": 0.55,
    "blackwell": 0.55,
    "ampere": 0.60,
    "ada": 0.55,
    "turing": 0.60,
    "volta": 0.65,
    "cdna3": 0.45,  # MI300X: hipBLASLt reaches about 600 of 1,307 bf16 TFLOP/s (AMD ROCm blog, 2024)
    "cpu": 0.50,
}
# fp8 / fp4 GEMMs reach a smaller share of their (doubled) peak: scaling and smaller tiles.
LOW_PRECISION_GEMM_SCALE = 0.80
# GEMMs with few rows (decode) cannot fill the GPU: below this many tokens a GEMM is costed
# at least as if it had this many (the kernels' tile height; Hopper's wgmma tiles are 64 rows).
GEMM_MIN_ROWS = 64

# --- Memory ------------------------------------------------------------------------------
# Fraction of HBM bandwidth a weight-streaming (decode) GEMM reaches: 80-85 % in the GEMV
# sweeps of vLLM's own kernels on H100 and A100 (vLLM's benchmark_marlin / Machete PR #7174);
# set to 0.75 against the public dataset's batch-4 H100 TPOT (GPUStack Qwen3-8B: 7.4 ms).
HBM_EFFICIENCY = 0.75
# Paged attention reading the KV cache in decode (FlashAttention / FlashInfer decode kernels:
# about 70 % of bandwidth at long context, less at short and with paged blocks of 16 tokens:
# FlashInfer's paper, MLSys 2025); 0.55 for the batches of a few hundred short sequences
# serving runs hold.
KV_READ_EFFICIENCY = 0.55
# Prefill attention (FlashAttention 2/3 forward, causal): 35-60 % of bf16 peak on H100
# (FlashAttention-3 paper, 2024, Figure 5).
PREFILL_ATTENTION_EFFICIENCY = 0.45

# --- Communication ---------------------------------------------------------------------
# All-reduce: the fixed latency of one call and the share of the link's bandwidth it reaches.
# vLLM's custom all-reduce over NVLink answers in about 6-10 us for decode-sized messages
# (vLLM PR #2192), about 15 us a call with its barrier and the kernel's launch in the public
# dataset's A100 batch-1 TP sweep (vLLM issue 16300); NCCL over PCIe about 20-30 us; NCCL
# across nodes 30-60 us over RDMA, more over TCP sockets (nccl-tests' small-message latencies).
ALLREDUCE_LATENCY_S = {"nvlink": 15e-6, "pcie": 25e-6, "network": 50e-6, "cpu": 30e-6}
LINK_EFFICIENCY = {"nvlink": 0.75, "pcie": 0.70, "network": 0.80, "cpu": 0.50}
# PCIe between GPUs without NVLink: the x16 slot's one-direction bandwidth, host-bridged.
# Across nodes: the node's NIC (gpu_facts' speed or vllm_fleet_nic_gbps).
# PP: one send/receive of a micro-batch's hidden states per stage boundary.
P2P_LATENCY_S = {"nvlink": 10e-6, "pcie": 20e-6, "network": 60e-6, "cpu": 50e-6}
# Fused MoE kernels (vLLM's Triton fused_moe with its tuned configs) reach a share of what a
# dense GEMM of the same bytes and FLOPs reaches that grows with the expert's width: narrow
# experts (DeepSeek's and Qwen3's 1,536-2,048) are many small GEMMs over gathered tokens, wide
# ones (Mixtral's 14,336) run close to dense (vLLM's benchmark_moe sweeps). The share is
# MOE_EFFICIENCY_BASE + intermediate / MOE_EFFICIENCY_WIDTH, at most MOE_EFFICIENCY_MAX; set
# against the public dataset's Mixtral (Lambda) and Qwen3-235B (GPUStack) ITLs.
MOE_EFFICIENCY_BASE = 0.35
MOE_EFFICIENCY_WIDTH = 16000.0
MOE_EFFICIENCY_MAX = 0.90


def moe_efficiency(intermediate: int) -> float:
    return min(MOE_EFFICIENCY_MAX, MOE_EFFICIENCY_BASE + intermediate / MOE_EFFICIENCY_WIDTH)


# Pipeline parallel: vLLM keeps one micro-batch per stage in flight (V1's batch queue), but
# stages are not balanced to the microsecond and the engine schedules, samples and returns each
# micro-batch serially: a pipeline reaches this share of its stages' combined speed. Set against
# the public dataset's GPUStack gpt-oss-120b runs (PP=2 at 0.70 of TP=2's throughput on the same
# H100s, where TP=2's all-reduces are cheap over NVLink).
PP_EFFICIENCY = 0.80
# Expert parallel all-to-all (dispatch and combine): a fixed cost per call on top of bytes.
ALL2ALL_LATENCY_S = 40e-6

# --- vLLM's fixed costs per engine step ------------------------------------------------
# Scheduling, input preparation, sampling, detokenizing and the CUDA graph replay of one step,
# (fixed seconds, seconds per running sequence), by the first release of each engine era:
# * before 0.6.0 the API server, the scheduler and the output processing shared one process and
#   ran between GPU steps: vLLM's 0.6.0 blog (https://blog.vllm.ai/2024/09/05/perf-update.html)
#   measured 62 % of an H100's time idle for Llama 3 8B;
# * 0.6.0 moved the API server to its own process and overlapped output processing (same post);
# * 0.8.0 made the V1 engine the default (https://blog.vllm.ai/2025/01/27/v1-alpha-release.html:
#   a persistent batch, an engine core process, piecewise CUDA graphs).
# The values were set against the public dataset's low-batch ITLs (make bench-perf).
ENGINE_OVERHEAD: tuple[tuple[tuple[int, int], float, float], ...] = (
    ((0, 0), 6.0e-3, 60e-6),
    ((0, 6), 4.0e-3, 20e-6),
    ((0, 8), 1.0e-3, 6e-6),
)


# The engine's Python runs on the host's CPU: hosts sold with a GPU generation differ in
# single-thread speed (A100 systems: Zen 2 / Ice Lake; H100 and later: Sapphire Rapids / Genoa,
# about 1.6-1.8x faster per thread in SPECint). The engine's time is divided by this factor;
# the public dataset's Lambda runs show it: at the same release, batch and TP=8, Mistral-7B's
# median ITL is 39.9 ms on A100 hosts and 21.6 ms on H100 hosts.
HOST_SPEED: dict[str, float] = {"hopper": 1.0, "blackwell": 1.0, "cdna3": 1.0, "ada": 0.8, "ampere": 0.6,
                                "turing": 0.6, "volta": 0.6}  # fmt: skip


def engine_overhead(version: str) -> tuple[float, float]:
    """(fixed, per-sequence) seconds of one step for vLLM ``version`` ("0.11.0")."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    key = [*parts, 0, 0][:2]
    chosen = ENGINE_OVERHEAD[0]
    for row in ENGINE_OVERHEAD:
        if (key[0], key[1]) >= row[0]:
            chosen = row
    return chosen[1], chosen[2]


# A request's own path outside the engine's steps before its first token: the HTTP server,
# tokenization, the hop to the engine core and back, the first token's detokenization and
# stream. The public dataset's lowest-load TTFTs: 60 ms for Qwen3-8B's ~220-token prompts at 4
# clients on H100 (GPUStack), 53 ms for 256-token prompts on an RTX 4090, where the prefill
# itself takes 7-40 ms.
REQUEST_OVERHEAD_S = 0.030
# Without CUDA graphs (--enforce-eager, or batches above the largest captured size) every
# kernel is launched from Python: about this much per layer and step.
EAGER_LAYER_S = 45e-6
# vLLM's largest captured CUDA graph batch (max_cudagraph_capture_size's default: 512 from
# vLLM 0.11; capped at 2 x max_num_seqs).
CUDA_GRAPH_MAX_BATCH = 512

# vLLM's CPU build: the engine loop per step, per layer (torch's eager kernels under oneDNN)
# and per running sequence, and a request's own path. Measured on this project's local default
# (tiny-llama, vLLM 0.32.0's CPU build from the role's venv, its engine bound to one of our 2-core
# EPYC's cores, 2026-12-07): TPOT 1.76 ms alone, 1.75 ms with 2 clients, 3.09 ms with 8 and
# 4.56 ms with 32 (128-token prompts); TTFT 11 ms for a lone 1,024-token prompt. The same machine
# measured 1.03 ms (verify, through nginx, the engine on both cores) to 2.0 ms on other runs:
# the host's contention moves it by that much.
CPU_STEP_OVERHEAD_S = 1.0e-3
CPU_LAYER_S = 0.08e-3
CPU_SEQ_OVERHEAD_S = 0.08e-3
CPU_REQUEST_OVERHEAD_S = 0.004

# --- The band ------------------------------------------------------------------------
# measured / predicted on the public dataset (make bench-perf): p10 and p90 of the ratio for
# each figure over the entries on vLLM's V1 engine (0.8 and later, the releases the fleet
# deploys; 25 throughput, 18 TPOT and 23 TTFT entries, 2026-12-07). The plan prints
# prediction x these as its band.
BAND: dict[str, tuple[float, float]] = {
    "output_token_throughput": (0.56, 1.37),
    "tpot_ms": (0.93, 2.14),
    "ttft_ms": (0.30, 2.36),
}

# --- Defaults the plan states --------------------------------------------------------
# The workload a plan is chosen for when the inventory names none: a chat-like request.
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 256
# Without an SLO, layouts are ranked by what they serve under this interactivity bound:
# 20 tokens/s per user (TPOT p90 <= 50 ms) and the first token within 2 s at p90.
DEFAULT_TPOT_P90_MS = 50.0
DEFAULT_TTFT_P90_MS = 2000.0

# --- Verify's bounded load --------------------------------------------------------------
# verify sends this load through the gateway, shaped like the workload, and compares what comes
# back with the plan's prediction for it: a few requests an instance, one client each, so that a
# measurement never pushes a small replica into its watchdog's restart (on our test hosts, one
# core a replica, two clients each sent a replica's /health past the watchdog's limit once).
VERIFY_CLIENTS_PER_INSTANCE = 1
VERIFY_REQUESTS_PER_CLIENT = 4
# The workload's lengths, at most these: the same shape, and verify's time stays bounded (a PP
# pair of containers on our test hosts ran 138 ms a token, 35 s for one 256-token request).
VERIFY_MAX_INPUT = 1024
VERIFY_MAX_OUTPUT = 128
# No client starts a request after this many seconds of the load (those started finish).
VERIFY_BUDGET_S = 15.0
VERIFY_MAX_CLIENTS = 16
