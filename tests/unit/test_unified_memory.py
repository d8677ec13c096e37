"""Integrated GPUs (the DGX Spark's GB10): vLLM reads the host's memory as theirs
(vllm_fleet/accounting/unified.py), and the catalog's per-GPU compute capability."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_glm5 import GLM5
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.accounting.unified import UMA_HOST_RESERVE_GIB, reads_available, startup_free_bytes
from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import lookup_gpu, lookup_model
from vllm_fleet.model.spec import load_model, spec_from_config
from vllm_fleet.planning.cluster import cluster_from_data, node_from_dict
from vllm_fleet.planning.strategy import Wishes, plan_cluster
from vllm_fleet.planning.table import render_estimate

GB10 = Device("GB10", 121.69, "cuda", 12, None, 121, True)
THOR = Device("Thor", 122.0, "cuda", 11, None, 110, True)
ORIN = Device("Orin", 61.0, "cuda", 8, None, 87, True)
H100 = Device("H100-SXM", 79.19, "cuda", 9, None, 90)


def _qwen3_8b() -> Any:
    cfg = lookup_model("Qwen/Qwen3-8B")
    assert cfg is not None
    return spec_from_config(cfg, "Qwen/Qwen3-8B")


def test_the_default_is_lowered_to_what_the_host_leaves() -> None:
    """vLLM's GB10 recipe needs 0.85: the default 0.92 asks for more than the host's memory the OS
    and vLLM's processes leave; the plan takes the most that starts and says why."""
    est = estimate(_qwen3_8b(), GB10, Settings(max_model_len=8192))
    assert est.fits and est.gpu_memory_utilization == 0.85
    assert any("unified memory" in n and "0.92" in n for n in est.notes)
    assert any("MemAvailable" in a and f"{UMA_HOST_RESERVE_GIB:g} GiB left to the OS" in a for a in est.assumptions)
    # A discrete GPU keeps vLLM's default, and no unified-memory line.
    h100 = estimate(_qwen3_8b(), H100, Settings(max_model_len=8192))
    assert h100.gpu_memory_utilization == 0.92 and not any("unified" in a for a in h100.assumptions)


def test_a_stated_utilization_above_it_is_refused_with_the_fix() -> None:
    est = estimate(_qwen3_8b(), GB10, Settings(max_model_len=8192, gpu_memory_utilization=0.9))
    assert not est.fits
    assert "unified memory" in est.reason and "lower it to 0.85 or less" in est.reason


def test_stated_free_memory_replaces_the_reserve() -> None:
    """gpu_free_gib on unified memory is the MemAvailable vLLM's snapshot reads: the default is
    still lowered to what it leaves (the host always shares), not refused."""
    roomy = Device("GB10", 121.69, "cuda", 12, 110.0, 121, True)
    assert startup_free_bytes(roomy) == 110.0 * (1 << 30)
    assert startup_free_bytes(GB10) == (121.69 - UMA_HOST_RESERVE_GIB) * (1 << 30)
    # A small host keeps 15 % of itself, not 17.5 GiB: a 16 GB Jetson Orin plans 0.81 beside the CUDA context.
    orin16 = Device("Orin", 15.3, "cuda", 8, None, 87, True)
    assert startup_free_bytes(orin16) == pytest.approx(15.3 * 0.85 * (1 << 30))
    small = spec_from_config(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048, "vocab_size": 32000,
         "max_position_embeddings": 4096, "torch_dtype": "bfloat16"},
        "small",
    )  # fmt: skip
    assert estimate(small, orin16, Settings()).gpu_memory_utilization == 0.81  # floor((13.005 - 0.6) / 15.3)
    est = estimate(_qwen3_8b(), roomy, Settings(max_model_len=8192))
    assert est.fits and est.gpu_memory_utilization == 0.89  # floor((110 - 0.6) / 121.69, 0.01)
    assert any("110 GiB free as stated" in a for a in est.assumptions)
    # On a discrete GPU a stated free figure below the default is refused (other processes hold it).
    busy = Device("H100-SXM", 79.19, "cuda", 9, 60.0, 90)
    assert not estimate(_qwen3_8b(), busy, Settings(max_model_len=8192)).fits


@pytest.mark.parametrize(
    ("device", "version", "available"),
    [
        (GB10, "0.11.2", False),  # cudaMemGetInfo (MemFree) on every GPU
        (GB10, "0.12.0", True),  # shared_sysmem_device_mem_sms: (8,7), (11,0), (12,1)
        (THOR, "0.19.0", True),
        (ORIN, "0.14.0", True),
        (Device("iGPU", 60.0, "cuda", 9, None, 90, True), "0.19.0", False),  # not in that tuple
        (Device("iGPU", 60.0, "cuda", 9, None, 90, True), "0.20.0", True),  # is_integrated (PR #35356)
        (H100, "0.32.0", False),
    ],
)
def test_which_free_memory_each_release_reads(device: Device, version: str, available: bool) -> None:
    assert reads_available(device, version) is available


def test_releases_reading_memfree_say_to_drop_the_caches() -> None:
    est = estimate(_qwen3_8b(), GB10, Settings(max_model_len=8192, vllm_version="0.11.0"))
    assert any("MemFree" in a and "drop_caches" in a for a in est.assumptions)


def test_inventory_nodes_take_the_catalogs_or_the_stated_unified_memory() -> None:
    spark = node_from_dict({"name": "spark1", "gpu": "NVIDIA GB10", "gpu_count": 1}, 0)
    assert spark.unified_memory and spark.gpu == "GB10" and spark.device().unified_memory
    assert spark.device().compute_capability == 121 and spark.device().sm_major == 12
    stated = node_from_dict(
        {"name": "jetson", "gpu": "Thor", "gpu_count": 1, "gpu_memory_gib": 122, "unified_memory": "yes"}, 0
    )
    assert stated.unified_memory
    assert not node_from_dict({"name": "h", "gpu": "H100-SXM", "gpu_count": 8}, 0).unified_memory


@pytest.mark.parametrize(
    ("name", "capability"),
    [("RTX-PRO-6000", 120), ("B200", 100), ("A10", 86), ("L40S", 89), ("H100-PCIe", 90), ("T4", 75), ("GB10", 121)],
)
def test_every_catalog_gpu_has_its_own_compute_capability(name: str, capability: int) -> None:
    gpu = lookup_gpu(name)
    assert gpu is not None and gpu.capability == capability
    node = node_from_dict({"name": "n", "gpu": name, "gpu_count": 1}, 0)
    assert node.device().compute_capability == capability


def test_an_rtx_pro_6000_is_not_sm10x() -> None:
    """GLM-5's fp8 KV default is for SM10x (GlmMoeDsaForCausalLM): an RTX PRO 6000 is sm_120, which
    the catalog took for 10.0 when capabilities came from the architecture."""
    spec = spec_from_config(GLM5, "glm5")
    pro = node_from_dict({"name": "n", "gpu": "RTX-PRO-6000", "gpu_count": 1}, 0).device()
    b200 = node_from_dict({"name": "n", "gpu": "B200", "gpu_count": 1}, 0).device()
    settings = Settings(max_model_len=8192)
    assert not any("fp8 KV cache" in n for n in estimate(spec, pro, settings).notes)
    assert any("fp8 KV cache" in n for n in estimate(spec, b200, settings).notes)


def test_the_graph_estimate_is_off_on_unified_memory_and_the_launch_says_so() -> None:
    """vLLM 0.21+ subtracts a CUDA graph estimate read from cudaMemGetInfo, which goes negative on
    a GB10 (vllm-project/vllm #44740): the fleet starts vLLM there with the estimate off, plans the
    pool without it and renders the variable; a discrete GPU keeps vLLM's default."""
    spec = _qwen3_8b()
    off = estimate(spec, GB10, Settings(max_model_len=8192))
    on = estimate(spec, GB10, Settings(max_model_len=8192, estimate_cudagraphs=True))
    graphs = off.ranks[0].cuda_graph_gib
    assert graphs > 0
    assert off.launch_env == {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"} and on.launch_env == {}
    assert "start vLLM with: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in render_estimate(off)
    # The same budget, the pool larger by the graphs' estimate.
    assert off.ranks[0].available_kv_gib - on.ranks[0].available_kv_gib == pytest.approx(graphs)
    assert any(
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in a and "on top of the budget" in a for a in off.assumptions
    )
    assert any("=1" in a and "larger than planned" in a for a in on.assumptions)
    h100 = estimate(spec, H100, Settings(max_model_len=8192))
    assert h100.launch_env == {} and not any("ESTIMATE_CUDAGRAPHS" in a for a in h100.assumptions)
    # Releases before 0.21 capture the graphs outside the budget anyway: nothing to set.
    old = estimate(spec, GB10, Settings(max_model_len=8192, vllm_version="0.20.0"))
    assert old.launch_env == {} and old.ranks[0].available_kv_gib == pytest.approx(off.ranks[0].available_kv_gib)


def test_the_plan_renders_it_and_the_operators_value_wins() -> None:
    cluster = cluster_from_data({"nodes": [{"name": "spark1", "gpu": "GB10", "gpu_count": 1}]})
    spec = load_model("Qwen/Qwen3-8B")
    (inst,) = plan_cluster(spec, cluster, Wishes(max_model_len=8192))["instances"]
    assert inst["env"]["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"
    # Set by the operator (vllm_fleet_extra_env), the plan accounts for it and renders nothing of its own.
    asked = Wishes(max_model_len=8192, extra_env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"})
    (inst1,) = plan_cluster(spec, cluster, asked)["instances"]
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS" not in inst1["env"]
    # The operator's 0 is rendered too: a launch path without their environment (Ray Serve,
    # Kubernetes without the inventory) keeps what the plan accounted for.
    zero = Wishes(max_model_len=8192, extra_env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"})
    (inst0,) = plan_cluster(spec, cluster, zero)["instances"]
    assert inst0["env"]["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"
    assert inst1["memory"]["ranks"][0]["available_kv_gib"] < inst["memory"]["ranks"][0]["available_kv_gib"]
    with pytest.raises(PlanError, match="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"):
        plan_cluster(
            spec, cluster, Wishes(max_model_len=8192, extra_env={"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "yes"})
        )


def test_two_sparks_at_tp2_keep_no_custom_all_reduce() -> None:
    """A TP=2 pair across two single-GPU nodes: CustomAllreduce turns itself off across nodes, so
    the plan keeps no IPC buffers and says so (it said "kept (two GPUs)")."""
    nodes = [{"name": f"spark{i}", "gpu": "GB10", "gpu_count": 1} for i in (1, 2)]
    cluster = cluster_from_data({"nodes": nodes})
    wishes = Wishes(max_model_len=8192, tensor_parallel_size=2, allow_cross_node_tp=True)
    (inst,) = plan_cluster(load_model("Qwen/Qwen3-8B"), cluster, wishes)["instances"]
    assert inst["tensor_parallel_size"] == 2 and len(inst["nodes"]) == 2
    lines = inst["memory"]["assumptions"]
    assert any("custom all-reduce off" in a and "different nodes" in a for a in lines), lines
    assert not any("custom all-reduce kept" in a for a in lines)
