from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.accounting.base import GIB, Accounting, default_gpu_memory_utilization
from vllm_fleet.accounting.memory import default_partition, estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, load_cluster, plan_cluster

H100 = Device("H100-SXM", 79.19, "cuda", 9)
L20 = Device("L20", 44.39, "cuda", 8)


def test_llama3_8b_weights_are_its_parameter_bytes() -> None:
    est = estimate(load_model("meta-llama/Meta-Llama-3-8B"), H100, Settings(max_model_len=8192))
    # 8,030,261,248 parameters in bf16 plus the 8192 x 128 rotary cache.
    assert est.weights_gib * GIB == pytest.approx(8_030_261_248 * 2 + 8192 * 128 * 2, rel=1e-9)


@pytest.mark.parametrize(
    ("model", "tp", "kv_dtype", "expected"),
    [
        pytest.param("meta-llama/Llama-3.1-8B", 1, "auto", 2 * 32 * 8 * 128 * 2, id="gqa-tp1"),
        pytest.param("meta-llama/Llama-3.1-8B", 2, "auto", 2 * 32 * 4 * 128 * 2, id="gqa-tp2-split"),
        pytest.param("meta-llama/Llama-3.1-8B", 16, "auto", 2 * 32 * 1 * 128 * 2, id="kv-heads-replicated"),
        pytest.param("meta-llama/Llama-3.1-8B", 1, "fp8", 2 * 32 * 8 * 128, id="fp8-kv"),
        pytest.param("deepseek-ai/DeepSeek-V3", 8, "auto", 61 * 576 * 2, id="mla-not-split-by-tp"),
        pytest.param("Qwen/Qwen3-14B", 1, "auto", 163_840, id="qwen3-14b"),
    ],
)
def test_kv_bytes_per_token(model: str, tp: int, kv_dtype: str, expected: int) -> None:
    spec = load_model(model)
    est = estimate(
        spec, Device("big", 1000.0), Settings(tensor_parallel_size=tp, kv_cache_dtype=kv_dtype, max_model_len=4096)
    )
    assert est.kv_bytes_per_token == expected


def test_tp_shards_weights_and_vocab() -> None:
    spec = load_model("meta-llama/Llama-3.1-70B")
    one = estimate(spec, Device("big", 1000.0), Settings(max_model_len=4096))
    four = estimate(spec, Device("big", 1000.0), Settings(tensor_parallel_size=4, max_model_len=4096))
    rope = spec.max_position_embeddings * 128 * 2 / GIB
    assert (four.weights_gib - rope) == pytest.approx((one.weights_gib - rope) / 4, rel=0.002)


def test_pp_puts_embedding_first_and_head_last() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    est = estimate(spec, H100, Settings(pipeline_parallel_size=2, max_model_len=8192))
    first, last = est.ranks
    assert first.layers == [0, 16] and last.layers == [16, 32]
    # Untied: both stages carry a vocab x hidden matrix; the last adds the final norm.
    assert last.weights_gib > first.weights_gib
    assert first.activation_gib < last.activation_gib  # only the last stage runs the sampler


@pytest.mark.parametrize(("layers", "pp", "expected"), [(32, 2, [16, 16]), (61, 2, [31, 30]), (10, 4, [2, 3, 3, 2])])
def test_default_partition_matches_vllm(layers: int, pp: int, expected: list[int]) -> None:
    assert default_partition(layers, pp) == expected


def test_every_rank_gets_the_smallest_ranks_blocks() -> None:
    spec = load_model("meta-llama/Llama-3.1-70B")
    est = estimate(
        spec,
        H100,
        Settings(tensor_parallel_size=4, pipeline_parallel_size=2, max_model_len=8192),
        devices_per_stage=[H100, L20],
    )
    stage0, stage1 = est.ranks[0], est.ranks[-1]
    assert stage0.available_kv_gib > stage1.available_kv_gib
    assert stage0.num_gpu_blocks == stage1.num_gpu_blocks
    assert stage0.kv_cache_gib == pytest.approx(stage1.kv_cache_gib)  # same layers and block bytes


def test_custom_partition_must_sum_to_layers() -> None:
    with pytest.raises(
        PlanError, match=r"layer_partition: \[10, 10\] must be positive and sum to num_hidden_layers=32"
    ):
        estimate(
            load_model("meta-llama/Llama-3.1-8B"), H100, Settings(pipeline_parallel_size=2, layer_partition=[10, 10])
        )


def test_enforce_eager_drops_cuda_graphs_and_current_vllm_counts_them() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    graphs = estimate(spec, H100, Settings(max_model_len=8192))
    eager = estimate(spec, H100, Settings(max_model_len=8192, enforce_eager=True))
    assert graphs.ranks[0].cuda_graph_gib > 0.1 and eager.ranks[0].cuda_graph_gib == 0
    assert eager.ranks[0].available_kv_gib - graphs.ranks[0].available_kv_gib == pytest.approx(
        graphs.ranks[0].cuda_graph_gib
    )


def test_activation_grows_with_batched_tokens() -> None:
    spec = load_model("Qwen/Qwen3-30B-A3B")
    small = estimate(spec, H100, Settings(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=8))
    large = estimate(spec, H100, Settings(max_model_len=8192, max_num_batched_tokens=16384, max_num_seqs=8))
    assert large.ranks[0].activation_gib > 4 * small.ranks[0].activation_gib


def test_defaults_follow_vllm_serve() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    h100 = estimate(spec, H100, Settings(max_model_len=8192))
    l20 = estimate(spec, L20, Settings(max_model_len=8192))
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)
    assert (l20.max_num_seqs, l20.max_num_batched_tokens) == (256, 2048)
    assert estimate(spec, H100).max_model_len == 131072


def test_kv_tokens_concurrency_and_fit() -> None:
    spec = load_model("meta-llama/Llama-3.1-8B")
    est = estimate(spec, Device("RTX-4090", 23.52, "cuda", 8), Settings(max_model_len=131072))
    assert not est.fits
    assert "the largest max_model_len that fits is" in est.reason
    # vLLM 0.32 plans the fit against the available memory less one block (the null block
    # BlockPool holds back, get_kv_cache_configs).
    assert est.max_model_len_fit == (est.num_gpu_blocks - 1) * est.block_size
    ok = estimate(spec, L20, Settings(max_model_len=8192))
    assert ok.fits and ok.max_concurrency == pytest.approx(ok.num_gpu_blocks / (8192 / 16))


def test_sliding_window_layers_need_less_kv_per_request() -> None:
    spec = load_model("openai/gpt-oss-120b")
    est = estimate(spec, H100, Settings(max_model_len=131072))
    full_only = est.num_gpu_blocks / (2 * 131072 / 16)
    assert est.max_concurrency > 1.5 * full_only


def test_weights_over_budget_do_not_fit() -> None:
    est = estimate(load_model("meta-llama/Llama-3.1-70B"), L20, Settings(max_model_len=4096))
    assert not est.fits
    assert est.reason.startswith("weights and overheads exceed the budget on stage 0 by")


def test_utilization_above_free_memory_does_not_fit() -> None:
    busy = Device("H100-SXM", 79.19, "cuda", 9, free_gib=60.0)
    est = estimate(load_model("meta-llama/Llama-3.1-8B"), busy, Settings(max_model_len=8192))
    assert not est.fits and "only" in est.reason and "is free" in est.reason


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(Settings(gpu_memory_utilization=1.5), r"--gpu-memory-utilization: 1.5 is above 1", id="util"),
        pytest.param(
            Settings(gpu_memory_utilization=0), r"--gpu-memory-utilization: must be a number from", id="util-zero"
        ),
        pytest.param(Settings(tensor_parallel_size=3), r"--tensor-parallel-size: TP=3 does not divide the 32", id="tp"),
        pytest.param(Settings(tensor_parallel_size=0), r"--tensor-parallel-size: must be a positive", id="tp-zero"),
        pytest.param(Settings(pipeline_parallel_size=40), r"--pipeline-parallel-size: 40 stages for 32", id="pp"),
        pytest.param(Settings(max_model_len=-1), r"--max-model-len: must be a positive integer", id="mml"),
    ],
)
def test_bad_settings_name_the_flag(settings: Settings, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        estimate(load_model("meta-llama/Llama-3.1-8B"), H100, settings)


def test_cpu_device_has_no_graphs_or_nccl(tiny_model: Path) -> None:
    est = estimate(load_model(str(tiny_model)), Device("cpu", 2.0, "cpu", 0), Settings(max_model_len=2048))
    rank = est.ranks[0]
    assert rank.cuda_graph_gib == 0 and rank.non_torch_gib == 0 and est.block_size == 128
    assert est.fits


def test_safetensors_bytes_replace_the_formula(tiny_model: Path) -> None:
    spec = load_model(str(tiny_model))
    assert spec.file_bytes is not None
    est = estimate(spec, H100, Settings(max_model_len=2048))
    rope = 2048 * 32 * 2
    assert est.weights_gib * GIB == pytest.approx(sum(spec.file_bytes.values()) + rope, rel=1e-9)


@pytest.mark.parametrize(
    ("version", "engine", "graphs_in_budget", "nccl_in_budget"),
    [("0.32.0", None, True, False), ("0.11.2", None, False, True), ("0.6.4", "v0", False, True)],
)
def test_accounting_by_release(version: str, engine: str | None, graphs_in_budget: bool, nccl_in_budget: bool) -> None:
    acct = Accounting.for_version(version, engine)
    assert (acct.graphs_in_budget, acct.nccl_in_budget) == (graphs_in_budget, nccl_in_budget)


@pytest.mark.parametrize(("version", "default"), [("0.14.0", 0.9), ("0.19.1", 0.9), ("0.20.0", 0.92), ("0.32.0", 0.92)])
def test_an_unset_utilization_is_the_releases_default(version: str, default: float) -> None:
    """vLLM's CacheConfig default: 0.9 up to 0.19, 0.92 from 0.20 (each release's vllm/config/cache.py)."""
    assert default_gpu_memory_utilization(version) == default
    est = estimate(load_model("meta-llama/Llama-3.1-8B"), H100, Settings(max_model_len=8192, vllm_version=version))
    assert est.gpu_memory_utilization == default and est.fits
    assert (
        estimate(load_model("meta-llama/Llama-3.1-8B"), H100, Settings(max_model_len=8192)).gpu_memory_utilization
        == 0.92
    )


def test_an_unset_utilization_is_lowered_to_what_starts_beside_nccl() -> None:
    """Eight NVLinked A100-40G at TP=8: vLLM 0.32's default 0.92 asks for more than the CUDA context
    and NCCL's NVLink buffers (0.25 GiB a communicator, 0.35 GiB a peer, two communicators) leave
    free, so vLLM would refuse to start; unset, the plan takes the most that starts, renders it and
    says why. Asked for explicitly, 0.92 is refused."""
    cluster = cluster_from_data({"nodes": [{"name": "n", "gpu": "A100-40G", "gpu_count": 8}]})
    wishes = Wishes(max_model_len=32768, tensor_parallel_size=8)
    plan = plan_cluster(load_model("meta-llama/Llama-3.1-70B"), cluster, wishes)
    (inst,) = plan["instances"]
    assert inst["tensor_parallel_size"] == 8
    used = float(inst["vllm_args"][inst["vllm_args"].index("--gpu-memory-utilization") + 1])
    # floor((39.39 - 0.6 - 2 x (0.25 + 0.35 x 7) - 0.1) / 39.39, 0.01)
    assert used == 0.84 and inst["memory"]["gpu_memory_utilization"] == used
    assert any("not vLLM 0.32.0's default 0.92" in n and "would refuse to start" in n for n in inst["memory"]["notes"])
    with pytest.raises(NothingFitsError):
        plan_cluster(
            load_model("meta-llama/Llama-3.1-70B"),
            cluster,
            Wishes(max_model_len=32768, tensor_parallel_size=8, gpu_memory_utilization=0.92),
        )


def test_pcie_nccl_leaves_the_default_standing() -> None:
    """The seeds' A800 + L20 pipeline: over PCIe, NCCL's two channels a peer (accounting/base.py
    NCCL_PCIE_*) leave the L20s room for vLLM 0.32's default 0.92 at TP=8."""
    cluster = load_cluster(FIXTURES / "a800_l20.yml")
    plan = plan_cluster(load_model("deepseek-ai/DeepSeek-R1"), cluster, Wishes(max_model_len=32768))
    (inst,) = plan["instances"]
    assert inst["memory"]["gpu_memory_utilization"] == 0.92
    assert not any("would refuse to start" in n for n in inst["memory"]["notes"])


@pytest.mark.parametrize(("version", "tokens"), [("0.27.0", 8192), ("0.28.0", 16384), ("0.32.0", 16384)])
def test_the_160_gib_batch_tier_follows_the_release(version: str, tokens: int) -> None:
    """EngineArgs.get_batch_defaults: a B200 (at least 160 GiB) gets 16,384 batched tokens from vLLM 0.28
    on, 8,192 before (the 70 GiB tier)."""
    b200 = Device("B200", 178.36, "cuda", 10)
    est = estimate(load_model("meta-llama/Llama-3.1-8B"), b200, Settings(max_model_len=32768, vllm_version=version))
    assert (est.max_num_batched_tokens, est.max_num_seqs) == (tokens, 1024)
