"""MoE memory under expert / data parallelism, as vLLM 0.32 lays it out.

Expected numbers are derived here from vLLM's rules (``determine_expert_map``,
``FusedMoEParallelConfig.make``, ``TritonExperts.workspace_shapes``, the DP all-gather of
``AgRsAll2AllManager.dispatch``), not copied from the planner's output.

No public startup log of the brief's case (Qwen3-235B-A22B FP8, TP=8 with
--enable-expert-parallel on 8 L40S) was found, so there is no log regression point here.
"""

from __future__ import annotations

import json
import math

import pytest

from vllm_fleet.accounting.base import (
    DEEPEP_BUFFER_MIB,
    EPLB_WINDOW,
    FUSED_MOE_CHUNK,
    GIB,
    MIB,
    NCCL_PCIE_COMM_GIB,
    NCCL_PCIE_PER_PEER_GIB,
)
from vllm_fleet.accounting.memory import estimate, moe_parallel
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import node_from_dict

H100 = Device("H100", 79.19)
QWEN3_30B = "Qwen/Qwen3-30B-A3B"  # 48 layers, hidden 2048, 128 experts x 768, top-8, bf16


def _moe_layers(spec_name: str) -> int:
    spec = load_model(spec_name)
    return sum(spec.is_moe_layer(i) for i in range(spec.num_layers))


def _expert_bytes(experts: float, shard: int, spec_name: str = QWEN3_30B) -> float:
    """Routed-expert bf16 bytes of one rank: gate, up and down projections of ``experts``
    experts, the intermediate size split over ``shard`` ranks, over every MoE layer."""
    spec = load_model(spec_name)
    return _moe_layers(spec_name) * experts * 3 * spec.hidden_size * spec.moe_intermediate_size / shard * 2


def _busiest_rank(experts: int, ep: int) -> int:
    """determine_expert_map: experts // ep each, the first experts % ep ranks one more."""
    return max(experts // ep + (1 if rank < experts % ep else 0) for rank in range(ep))


@pytest.mark.parametrize(("dp", "experts_per_rank"), [(3, 43), (8, 16), (5, 26)])
def test_expert_parallel_holds_the_busiest_ranks_whole_experts(dp: int, experts_per_rank: int) -> None:
    assert _busiest_rank(128, dp) == experts_per_rank
    spec = load_model(QWEN3_30B)
    est = estimate(spec, H100, Settings(data_parallel_size=dp, enable_expert_parallel=True, max_model_len=4096))
    assert moe_parallel(spec, Settings(data_parallel_size=dp, enable_expert_parallel=True)).local_experts == (
        experts_per_rank
    )
    assert est.ranks[0].parts["weights.routed_experts_gib"] == pytest.approx(
        _expert_bytes(experts_per_rank, 1) / GIB, 1e-3
    )
    assert any(f"{experts_per_rank} of 128 experts" in line for line in est.assumptions)


def test_without_expert_parallel_experts_are_sharded_over_dp_times_tp() -> None:
    # FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp: MoE TP = dp x tp without EP.
    spec = load_model(QWEN3_30B)
    dp4 = estimate(spec, H100, Settings(data_parallel_size=4, max_model_len=4096))
    tp1 = estimate(spec, H100, Settings(max_model_len=4096))
    assert dp4.ranks[0].parts["weights.routed_experts_gib"] == pytest.approx(_expert_bytes(128, 4) / GIB, 1e-3)
    saved = _expert_bytes(128, 1) - _expert_bytes(128, 4)
    assert (tp1.weights_gib - dp4.weights_gib) * GIB == pytest.approx(saved, rel=1e-3)


def test_redundant_experts_need_eplb_and_add_experts_and_load_buffers() -> None:
    spec = load_model(QWEN3_30B)
    with pytest.raises(PlanError, match="only supported with EPLB"):
        estimate(spec, H100, Settings(data_parallel_size=8, enable_expert_parallel=True, num_redundant_experts=32))
    base = Settings(data_parallel_size=8, enable_expert_parallel=True, max_model_len=4096)
    plain = estimate(spec, H100, base)
    eplb = estimate(
        spec,
        H100,
        Settings(
            data_parallel_size=8,
            enable_expert_parallel=True,
            max_model_len=4096,
            enable_eplb=True,
            num_redundant_experts=32,
        ),
    )
    per_rank = _busiest_rank(128 + 32, 8)  # 20
    assert eplb.ranks[0].parts["weights.routed_experts_gib"] == pytest.approx(_expert_bytes(per_rank, 1) / GIB, 1e-3)
    # EplbState.add_model: expert_buffer (one layer's local experts) + int32 load window and pass buffer.
    buffers = _expert_bytes(per_rank, 1) / _moe_layers(QWEN3_30B) + (EPLB_WINDOW + 1) * 48 * 160 * 4
    assert eplb.ranks[0].parts["weights.eplb_buffers_gib"] == pytest.approx(buffers / GIB, 1e-3)
    grown = _expert_bytes(per_rank - 16, 1) + buffers
    assert (eplb.weights_gib - plain.weights_gib) * GIB == pytest.approx(grown, rel=1e-3)


def _triton_workspace(tokens: int, inter: float, hidden: int, topk: int) -> float:
    """TritonExperts.workspace_shapes for M tokens, bf16: workspace13 (M, topk, max(N/2, K))
    shared with the (M, K) output, and workspace2 (M, topk, max(N, K)), N = 2 x inter."""
    common = max(tokens * topk * max(inter, hidden), tokens * hidden)
    return (common + tokens * topk * max(2 * inter, hidden)) * 2


def test_dp_gathers_every_ranks_tokens_into_the_moe_layers() -> None:
    spec = load_model(QWEN3_30B)
    tokens = 8192  # H100 default max_num_batched_tokens
    est = estimate(spec, H100, Settings(data_parallel_size=4, enable_expert_parallel=True, max_model_len=4096))
    assert est.max_num_batched_tokens == tokens
    gathered = 4 * tokens
    assert est.ranks[0].parts["activation.moe_workspace_gib"] == pytest.approx(
        _triton_workspace(gathered, 768, 2048, 8) / GIB, 1e-6
    )
    # The other ranks' tokens add their workspace share, router logits (fp32), the gathered
    # hidden states (bf16) and top-k ids / weights (int32 + fp32).
    extra = (
        _triton_workspace(gathered, 768, 2048, 8)
        - _triton_workspace(tokens, 768, 2048, 8)
        + (gathered - tokens) * 128 * 4
        + gathered * (2048 * 2 + 8 * 8)
    )
    assert est.ranks[0].parts["activation.moe_all2all_gib"] == pytest.approx(extra / GIB, 1e-6)
    single = estimate(spec, H100, Settings(max_model_len=4096))
    assert "activation.moe_all2all_gib" not in single.parts()
    # The MoE layer's peak over the gathered tokens (workspaces, router logits, gathered hidden
    # states and top-k, the local output) now outgrows the sampler pass that bounds TP=1.
    moe_peak = _triton_workspace(gathered, 768, 2048, 8) + gathered * (128 * 4 + 2048 * 2 + 64) + tokens * 2048 * 2
    assert est.ranks[0].activation_gib * GIB > moe_peak > single.ranks[0].activation_gib * GIB
    assert any("4 x 8,192 = 32,768 tokens" in line for line in est.assumptions)


def test_0_32_workspaces_are_not_chunked_older_releases_are() -> None:
    spec = load_model(QWEN3_30B)
    tokens = 2 * FUSED_MOE_CHUNK
    settings = Settings(
        data_parallel_size=2, enable_expert_parallel=True, max_model_len=4096, max_num_batched_tokens=tokens
    )
    now = estimate(spec, H100, settings)
    assert now.ranks[0].parts["activation.moe_workspace_gib"] == pytest.approx(
        _triton_workspace(2 * tokens, 768, 2048, 8) / GIB, 1e-6
    )
    old_settings = Settings(**{**settings.__dict__, "vllm_version": "0.11.0"})
    old = estimate(spec, H100, old_settings)
    chunked = FUSED_MOE_CHUNK * 8 * (3 * 768 + 2048) * 2
    assert old.ranks[0].parts["activation.moe_workspace_gib"] == pytest.approx(chunked / GIB, 1e-6)


def test_deepep_buffers_only_with_dp_times_ep() -> None:
    spec = load_model(QWEN3_30B)
    common = {"enable_expert_parallel": True, "max_model_len": 4096}
    agrs = estimate(spec, H100, Settings(data_parallel_size=2, **common))  # type: ignore[arg-type]
    ht = estimate(spec, H100, Settings(data_parallel_size=2, all2all_backend="deepep_high_throughput", **common))  # type: ignore[arg-type]
    assert (ht.ranks[0].non_torch_gib - agrs.ranks[0].non_torch_gib) * GIB == pytest.approx(DEEPEP_BUFFER_MIB * MIB)
    assert ht.ranks[0].parts["non_torch.all2all_buffers_gib"] == pytest.approx(DEEPEP_BUFFER_MIB * MIB / GIB)
    assert ht.kv_cache_gib < agrs.kv_cache_gib
    # use_all2all_kernels needs dp > 1: TP=2 + EP in one DP rank has no all2all kernels.
    tp_ep = estimate(
        spec,
        H100,
        Settings(tensor_parallel_size=2, all2all_backend="deepep_low_latency", **common),  # type: ignore[arg-type]
    )
    assert "non_torch.all2all_buffers_gib" not in tp_ep.parts()
    assert "activation.moe_all2all_gib" not in tp_ep.parts()
    with pytest.raises(PlanError, match="unknown all2all backend"):
        estimate(spec, H100, Settings(all2all_backend="carrier_pigeon"))


def test_removed_backends_run_as_allgather_reducescatter() -> None:
    spec = load_model(QWEN3_30B)
    naive = moe_parallel(spec, Settings(data_parallel_size=2, enable_expert_parallel=True, all2all_backend="pplx"))
    assert naive.all2all == "allgather_reducescatter"


def test_pcie_turns_custom_all_reduce_off_above_two_gpus() -> None:
    spec = load_model("Qwen/Qwen3-235B-A22B")
    # A utilization given: unset, each would take the most that starts beside its own overheads.
    settings = Settings(tensor_parallel_size=8, enable_expert_parallel=True, quantization="fp8", max_model_len=8192,
                        gpu_memory_utilization=0.9)  # fmt: skip
    l40s = Device("L40S", 44.39, sm_major=8, capability=89)
    pcie = estimate(spec, l40s, settings, nvlink=False)
    linked = estimate(spec, l40s, settings, nvlink=True)
    # Outside the budget: NCCL's communicators and per-peer buffers (NVLink's 0.25 + 0.35 GiB x 7
    # peers against PCIe's 2 channels, two communicators) and the custom all-reduce IPC buffers;
    # the KV pool does not move.
    gap = linked.ranks[0].startup_overhead_gib - pcie.ranks[0].startup_overhead_gib
    pcie_nccl = 2 * (NCCL_PCIE_COMM_GIB + NCCL_PCIE_PER_PEER_GIB * 7)
    assert pytest.approx(9 / 1024) == NCCL_PCIE_PER_PEER_GIB and NCCL_PCIE_COMM_GIB == 0.0625
    assert gap == pytest.approx(2 * (0.25 + 0.35 * 7) - pcie_nccl + 0.1, abs=1e-9)
    assert pcie.num_gpu_blocks == linked.num_gpu_blocks
    assert any("custom all-reduce off" in line for line in pcie.assumptions)
    pair = estimate(spec, l40s, Settings(**{**settings.__dict__, "tensor_parallel_size": 2}), nvlink=False)
    assert any("custom all-reduce kept" in line for line in pair.assumptions)


def test_estimate_cli_takes_nvlink_from_the_catalog_and_reads_eplb_config(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", QWEN3_30B, "--gpu", "L40S", "-tp", "4", "--max-model-len", "4096", "--json"]
    assert main([*argv, "--enable-expert-parallel"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("custom all-reduce off" in line for line in data["assumptions"])
    assert data["parts"]["weights.routed_experts_gib"] == pytest.approx(_expert_bytes(32, 1) / GIB, 1e-3)
    assert main([*argv, "--nvlink"]) == 0
    assert not any("PCIe" in line for line in json.loads(capsys.readouterr().out)["assumptions"])
    eplb = ["--enable-expert-parallel", "--enable-eplb", "--eplb-config", '{"num_redundant_experts": 4}']
    assert main([*argv, *eplb]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parts"]["weights.routed_experts_gib"] == pytest.approx(
        _expert_bytes(math.ceil(132 / 4), 1) / GIB, 1e-3
    )
    assert main([*argv, "--eplb-config", "not json"]) != 0
    assert "--eplb-config" in capsys.readouterr().err


def test_geforce_pairs_have_no_custom_all_reduce() -> None:
    """vLLM's custom all-reduce needs peer-to-peer access (_can_p2p), which GeForce cards lack
    without an NVLink bridge: a pair of RTX 4090s keeps no IPC buffers; an NVLinked pair does."""
    spec = load_model("Qwen/Qwen2.5-14B")
    settings = Settings(tensor_parallel_size=2, max_model_len=8192)
    geforce = node_from_dict({"name": "n", "gpu": "RTX-4090", "gpu_count": 2}, 0)
    bridged = node_from_dict({"name": "n", "gpu": "RTX-3090", "gpu_count": 2, "nvlink": True}, 0)
    l40s = node_from_dict({"name": "n", "gpu": "L40S", "gpu_count": 2}, 0)
    pair = estimate(spec, geforce.device(), settings, nvlink=False)
    assert any("custom all-reduce off (no peer-to-peer access between the GPUs" in a for a in pair.assumptions)
    kept = estimate(spec, l40s.device(), settings, nvlink=False)
    assert any("custom all-reduce kept (two GPUs)" in a for a in kept.assumptions)
    # The IPC buffers (0.1 GiB x tp / 8) are what the two differ by outside the budget.
    gap = kept.ranks[0].startup_overhead_gib - pair.ranks[0].startup_overhead_gib
    assert gap == pytest.approx(0.1 * 2 / 8)
    assert bridged.device().p2p and not geforce.device().p2p
