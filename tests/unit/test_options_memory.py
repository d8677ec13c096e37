"""Memory of the options users turn on (vllm_fleet/accounting/options.py): LoRA slots, speculative
decoding, CPU offload, fp8 KV scales, kv_cache_memory_bytes, prefix caching, and the free
memory vLLM's request_memory checks (facts -> cluster -> plan)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.accounting.activation import _capture_sizes
from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import NothingFitsError, PlanError
from vllm_fleet.inventory import facts
from vllm_fleet.model.spec import ModelSpec, load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

H100 = Device("H100-SXM", 79.65)
TINY_LLAMA = ModelSpec(
    name="tiny-llama",
    model_type="llama",
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    num_kv_heads=4,
    head_dim=32,
    intermediate_size=512,
    vocab_size=1000,
    max_position_embeddings=4096,
)


def _est(spec: ModelSpec, device: Device = H100, **settings: Any) -> Any:
    return estimate(spec, device, Settings(**settings))


# -- LoRA ---------------------------------------------------------------------


def test_lora_slots_of_a_tiny_llama_are_the_shapes_vllm_allocates() -> None:
    """Worked by hand from vLLM's create_lora_weights, TP=2, rank 8, 3 slots, bf16: per layer
    qkv (3 A of 8x256, B 128+64+64 rows x 8), o (A 8x128, B 256x8), gate_up (2 A of 8x256,
    B 2 x 256 rows x 8), down (A 8x256, B 256x8); embedding A 1000x8, B 256x8; logits A 8x256,
    B 1000x8."""
    per_layer = (
        (3 * 8 * 256 + (128 + 64 + 64) * 8) + (8 * 128 + 256 * 8) + (2 * 8 * 256 + 512 * 8) + (8 * 256 + 256 * 8)
    )
    head_and_embed = (1000 * 8 + 256 * 8) + (8 * 256 + 1000 * 8)
    expected = 3 * 2 * (4 * per_layer + head_and_embed)
    est = _est(TINY_LLAMA, tensor_parallel_size=2, enable_lora=True, max_loras=3, max_lora_rank=8, max_model_len=4096)
    assert est.ranks[0].parts["weights.lora_gib"] * GIB == pytest.approx(expected, rel=1e-9)
    assert est.option_args == ["--enable-lora", "--max-loras", "3", "--max-lora-rank", "8"]


def test_lora_weights_join_the_weights_column_and_double_the_graphs() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    base = _est(spec, max_model_len=8192)
    lora = _est(spec, max_model_len=8192, enable_lora=True, max_loras=4, max_lora_rank=64)
    part = lora.ranks[0].parts["weights.lora_gib"]
    assert lora.weights_gib == pytest.approx(base.weights_gib + part, abs=1e-6)
    assert lora.ranks[0].cuda_graph_gib == pytest.approx(2 * base.ranks[0].cuda_graph_gib)
    assert lora.num_gpu_blocks < base.num_gpu_blocks
    assert any(line.startswith("LoRA (weights.lora_gib)") for line in lora.assumptions)


def test_fully_sharded_loras_shrink_each_rank_and_qwen2_has_no_embedding_slots() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    half = _est(spec, tensor_parallel_size=4, enable_lora=True, max_model_len=8192)
    full = _est(spec, tensor_parallel_size=4, enable_lora=True, fully_sharded_loras=True, max_model_len=8192)
    assert full.parts()["weights.lora_gib"] < half.parts()["weights.lora_gib"]
    # Qwen2's vLLM class declares no embedding_modules: the same shapes as Qwen3 minus embed/head.
    qwen2 = replace(TINY_LLAMA, model_type="qwen2")
    llama = _est(TINY_LLAMA, enable_lora=True, max_lora_rank=8, max_model_len=4096).ranks[0].parts
    other = _est(qwen2, enable_lora=True, max_lora_rank=8, max_model_len=4096).ranks[0].parts
    diff = (llama["weights.lora_gib"] - other["weights.lora_gib"]) * GIB
    assert diff == pytest.approx(2 * 8 * (1000 * 2 + 256 * 2), rel=1e-9)


def test_moe_lora_slots_cover_every_local_expert() -> None:
    spec = load_model("Qwen/Qwen3-30B-A3B")
    tp2 = _est(spec, tensor_parallel_size=2, enable_lora=True, max_model_len=8192).parts()["weights.lora_gib"]
    ep2 = _est(spec, tensor_parallel_size=2, enable_expert_parallel=True, enable_lora=True, max_model_len=8192).parts()[
        "weights.lora_gib"
    ]
    # With EP each rank holds half the experts at the full intermediate size: the expert A
    # slots over the hidden size halve, so EP needs less than TP.
    assert ep2 < tp2


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"enable_lora": True, "max_lora_rank": 7}, "--max-lora-rank"),
        ({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}, "--max-cpu-loras"),
        ({"enable_lora": True, "lora_dtype": "float32"}, "--lora-dtype"),
        ({"enable_lora": "yes"}, "--enable-lora"),
        ({"cpu_offload_gb": -1}, "--cpu-offload-gb"),
        ({"speculative_config": {"method": "medusa2", "num_speculative_tokens": 2}}, "--speculative-config"),
        ({"speculative_config": {"method": "ngram"}}, "--speculative-config"),
        ({"speculative_config": {"method": "mtp"}}, "--speculative-config"),  # Llama has no MTP modules
        ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 2}}, "--speculative-config"),
    ],
)
def test_bad_options_name_their_flag(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(PlanError) as err:
        _est(TINY_LLAMA, max_model_len=4096, **settings)
    assert err.value.field == field


def test_lora_refuses_a_vocabulary_vllms_logits_layer_cannot_take() -> None:
    with pytest.raises(PlanError, match="258,048"):
        _est(replace(TINY_LLAMA, vocab_size=262144), enable_lora=True, max_model_len=4096)


# -- speculative decoding -----------------------------------------------------


def test_deepseek_mtp_adds_a_layer_to_the_kv_pool_and_its_weights_to_the_last_stage() -> None:
    spec = load_model("deepseek-ai/DeepSeek-V3")
    h200 = Device("H200", 139.8)
    base = _est(spec, h200, tensor_parallel_size=8, max_model_len=32768)
    mtp = _est(spec, h200, tensor_parallel_size=8, max_model_len=32768, speculative_config={"method": "mtp"})
    assert mtp.parts()["kv.draft_layers"] == 1
    assert mtp.kv_bytes_per_token * 61 == base.kv_bytes_per_token * 62  # MLA latent of one more layer
    assert mtp.weights_gib > base.weights_gib + 1  # one MoE decoder layer in fp8 on each of 8 ranks
    assert mtp.num_gpu_blocks < base.num_gpu_blocks
    assert mtp.option_args == ["--speculative-config", '{"method":"mtp"}']
    pp = _est(
        spec,
        h200,
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        max_model_len=32768,
        speculative_config={"method": "deepseek_mtp", "num_speculative_tokens": 3},
    )
    first, last = pp.ranks[0], pp.ranks[-1]
    assert first.parts["weights.draft_gib"] == 0 and last.parts["weights.draft_gib"] > 1
    assert (first.parts["kv.draft_layers"], last.parts["kv.draft_layers"]) == (0, 1)


def test_mtp_token_count_must_be_a_multiple_of_n_predict() -> None:
    spec = replace(load_model("deepseek-ai/DeepSeek-V3"), mtp_layers=2)
    h200 = Device("H200", 139.8)
    ok = _est(spec, h200, tensor_parallel_size=8, max_model_len=8192, speculative_config={"method": "mtp"})
    assert ok.parts()["kv.draft_layers"] == 2
    assert "2 tokens" in " ".join(ok.assumptions)
    with pytest.raises(PlanError, match="divisible"):
        _est(
            spec,
            h200,
            tensor_parallel_size=8,
            max_model_len=8192,
            speculative_config={"method": "mtp", "num_speculative_tokens": 3},
        )


def test_ngram_has_no_draft_but_captures_decode_batches_of_k_plus_one() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    base = _est(spec, max_model_len=8192, max_num_seqs=64)
    ngram = _est(
        spec, max_model_len=8192, max_num_seqs=64, speculative_config={"method": "ngram", "num_speculative_tokens": 3}
    )
    assert ngram.parts() == {"kv.draft_layers": 0.0, "weights.draft_gib": 0.0}
    assert ngram.weights_gib == pytest.approx(base.weights_gib)
    assert ngram.ranks[0].cuda_graph_gib > base.ranks[0].cuda_graph_gib
    # 64 requests of 4 tokens: the ceiling is min(64 x 4 x 2, 512), and every request count of
    # the grid (1, 2, 4, 8, 16, ... 64) times 4 is a captured size.
    sizes = _capture_sizes(64, 8192, query_len=4)
    assert max(sizes) == 512 and {4 * n for n in (1, 2, 4, *range(8, 65, 8))} <= set(sizes)
    assert _capture_sizes(64, 8192) == _capture_sizes(64, 8192, query_len=1) and max(_capture_sizes(64, 8192)) == 128


def test_an_eagle_draft_with_another_page_size_adds_its_pages_to_each_block() -> None:
    target = TINY_LLAMA
    draft = replace(TINY_LLAMA, name="tiny-eagle", num_layers=1, num_kv_heads=8)  # twice the KV heads
    base = _est(target, max_model_len=4096, kv_cache_memory_bytes=1 << 30)
    eagle = _est(
        target,
        max_model_len=4096,
        kv_cache_memory_bytes=1 << 30,
        speculative_config={"method": "eagle", "model": "tiny-eagle", "num_speculative_tokens": 2},
        draft_spec=draft,
    )
    # per block: 4 target layers x (2 x 4 heads x 32 x 2 B) + 1 draft layer x (2 x 8 x 32 x 2 B), x 16 tokens
    assert base.num_gpu_blocks == (1 << 30) // (4 * 512 * 16)
    assert eagle.num_gpu_blocks == (1 << 30) // ((4 * 512 + 1024) * 16)
    assert eagle.kv_bytes_per_token == 4 * 512 + 1024


# -- CPU offload, fp8 KV, kv_cache_memory_bytes, prefix caching ----------------


def test_cpu_offload_takes_the_budget_from_the_decoder_layers_only() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    base = _est(spec, max_model_len=8192)
    off = _est(spec, max_model_len=8192, cpu_offload_gb=4)
    assert off.parts()["weights.cpu_offloaded_gib"] == pytest.approx(4.0)
    assert off.weights_gib == pytest.approx(base.weights_gib - 4.0, abs=1e-6)
    assert off.num_gpu_blocks > base.num_gpu_blocks
    # A budget above the layers' bytes offloads every layer, never the embeddings or the head.
    everything = _est(spec, max_model_len=8192, cpu_offload_gb=1000)
    assert 1.0 < everything.weights_gib < base.weights_gib - 10
    assert off.option_args == ["--cpu-offload-gb", "4"]


def test_kv_cache_memory_bytes_that_cannot_fit_next_to_the_weights_is_refused() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    est = _est(spec, max_model_len=8192, kv_cache_memory_bytes=70 * GIB)
    assert not est.fits and "kv_cache_memory_bytes" in est.reason
    small = _est(
        spec, max_model_len=8192, kv_cache_memory_bytes=20 * GIB, kv_cache_dtype="fp8", enable_prefix_caching=True
    )
    assert small.fits
    text = " ".join(small.assumptions)
    assert "skips profiling-based sizing" in text and "fp32 scalars" in text and "prefix caching" in text


# -- free memory: facts -> cluster -> plan -------------------------------------

APPS = "00000000:18:00.0, 4242, VLLM::Worker_TP0, 70000\n00000000:28:00.0, 4343, /usr/bin/python3 train.py, 30000\n"


def _busy_query() -> str:
    """The H100 host with GPU0 holding a vLLM worker (70000 MiB) and GPU1 a training job (30000 MiB)."""
    lines = (FIXTURES / "facts" / "h100-sxm.query.txt").read_text().splitlines()
    lines[0] = lines[0].replace(", 81008,", f", {81008 - 70000},")
    lines[1] = lines[1].replace(", 81008,", f", {81008 - 30000},")
    return "\n".join(lines) + "\n"


def test_facts_count_vllms_own_processes_as_free_and_take_the_fullest_gpu() -> None:
    raw = {"query_gpu": _busy_query(), "compute_apps": APPS}
    host = facts.host_facts(raw)
    # GPU1 lost 30000 MiB to a process that is not vLLM; GPU0's vLLM worker counts as free.
    assert host["gpu_free_gib"] == pytest.approx((81008 - 30000) / 1024, abs=0.01)
    assert [a["pid"] for a in host["gpu_processes"]] == [4242, 4343]
    # Without the process list the vLLM worker's memory is not known to be ours.
    unknown = facts.host_facts({"query_gpu": raw["query_gpu"]})
    assert unknown["gpu_free_gib"] == pytest.approx((81008 - 70000) / 1024, abs=0.01)
    assert facts.host_facts({})["gpu_free_gib"] is None


def _node(free: float | None) -> dict[str, Any]:
    node: dict[str, Any] = {"name": "n1", "gpu": "H100-SXM", "gpu_count": 8, "gpu_memory_gib": 79.65}
    if free is not None:
        node["gpu_free_gib"] = free
    return node


def test_the_plan_refuses_a_utilization_the_busy_gpus_cannot_give() -> None:
    spec = load_model("Qwen/Qwen3-8B")
    host = facts.host_facts({"query_gpu": _busy_query(), "compute_apps": APPS})
    nodes = cluster_from_data([_node(host["gpu_free_gib"])])
    with pytest.raises(NothingFitsError) as err:
        plan_cluster(spec, nodes, Wishes(max_model_len=8192))
    assert err.value.field == "gpu_memory_utilization"
    # TP=1 (no NCCL): (49.81 GiB free - 0.6 GiB CUDA context) / 79.65 GiB = 0.617...
    assert "TP=1" in str(err.value) and "to 0.61 or less" in str(err.value)
    plan = plan_cluster(spec, nodes, Wishes(max_model_len=8192, gpu_memory_utilization=0.6))
    assert plan["instances"]
    assert plan_cluster(spec, cluster_from_data([_node(None)]), Wishes(max_model_len=8192))["instances"]


# -- the command line and the rendered vllm serve ------------------------------


def test_estimate_cli_reads_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "estimate",
            "--model",
            "deepseek-ai/DeepSeek-V3",
            "--gpu",
            "H200",
            "-tp",
            "8",
            "--max-model-len",
            "8192",
            "--speculative-config",
            '{"method": "mtp", "num_speculative_tokens": 2}',
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parts"]["kv.draft_layers"] == 1 and out["parts"]["weights.draft_gib"] > 1
    assert out["option_args"][0] == "--speculative-config"
    assert main(["estimate", "--model", "Qwen/Qwen3-8B", "--gpu", "H100-SXM", "--speculative-config", "{bad"]) == 2
    assert "--speculative-config" in capsys.readouterr().err


def test_plan_renders_the_flags_it_planned_with(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yml"
    cluster.write_text("nodes:\n  - {name: n1, gpu: H100-SXM, gpu_count: 1}\n")
    code = main(
        [
            "plan",
            "--model",
            "Qwen/Qwen3-8B",
            "--cluster",
            str(cluster),
            "--max-model-len",
            "8192",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "32",
            "--cpu-offload-gb",
            "2",
            "--json",
        ]
    )
    assert code == 0
    (inst,) = json.loads(capsys.readouterr().out)["instances"]
    args = inst["vllm_args"]
    i = args.index("--enable-lora")
    assert args[i : i + 5] == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "32"]
    assert args[args.index("--cpu-offload-gb") + 1] == "2"
    assert inst["memory"]["parts"]["weights.lora_gib"] > 0


def test_the_plan_filter_takes_the_free_memory_facts_give_it() -> None:
    """plan_layout.yml hands each node's vllm_fleet_gpu_free_gib (set from gpu_facts in
    plan.yml) to the vllm_fleet_plan filter; the play then fails naming the inventory variable."""
    pytest.importorskip("ansible")

    from ansible.errors import AnsibleFilterError

    from tests.conftest import filter_plugins

    plan_filter = filter_plugins()["vllm_fleet_plan"]
    host = facts.host_facts({"query_gpu": _busy_query(), "compute_apps": APPS})
    node = _node(None) | {"gpu_free_gib": str(host["gpu_free_gib"])}  # templated values arrive as text
    with pytest.raises(AnsibleFilterError, match="vllm_fleet_gpu_memory_utilization"):
        plan_filter([node], "Qwen/Qwen3-8B", {"max_model_len": 8192})
    plan = plan_filter([node], "Qwen/Qwen3-8B", {"max_model_len": 8192, "gpu_memory_utilization": 0.6})
    assert plan["instances"]
