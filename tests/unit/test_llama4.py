"""Llama 4 (Scout, Maverick) as vLLM 0.32 builds and sizes it.

The expected values are derived here from config.json and the rules of vLLM's
``vllm/model_executor/models/llama4.py`` (which layers are MoE, the dense layers'
``intermediate_size_mlp``, one shared expert per MoE layer, no RoPE every fourth layer,
chunked local attention on the others), ``ChunkedLocalAttentionSpec`` and the hybrid KV
cache manager (``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``),
and checked against the model cards' parameter counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from vllm_fleet.accounting.base import GIB
from vllm_fleet.accounting.kv import chunked_local_attn_hybrid_kv
from vllm_fleet.accounting.memory import Estimate, estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.cli import main
from vllm_fleet.errors import PlanError
from vllm_fleet.model.catalog import lookup_model
from vllm_fleet.model.spec import ModelSpec, load_model, spec_from_config

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
BIG = Device("test", 4096.0)

# Parameters as the model cards publish them (meta-llama's Llama 4 model card, "Model
# Information" table): Scout 17B active / 109B total, Maverick 17B active / 400B total.
# The totals include the vision encoder (~0.9B: 34 ViT layers of 1408 and the projector),
# which the planner's Llama 4 entry does not count yet: the text model must come within 2 %.
CARDS = {SCOUT: (109e9, 17e9), MAVERICK: (400e9, 17e9)}


def _text(name: str) -> dict[str, Any]:
    cfg = lookup_model(name)
    assert cfg is not None
    text: dict[str, Any] = cfg["text_config"]
    return text


def _eager(spec: ModelSpec, **kw: Any) -> Estimate:
    return estimate(spec, BIG, Settings(max_model_len=4096, enforce_eager=True, **kw))


def _rotary_params(spec: ModelSpec) -> int:
    # get_rope's cos/sin cache: max_position_embeddings x head_dim, a buffer, not a parameter.
    return spec.max_position_embeddings * spec.head_dim


def _expected_params(t: dict[str, Any], tp: int = 1, ep: int = 1) -> float:
    """Per-rank parameters of the text model, written from llama4.py: QKVParallelLinear +
    RowParallelLinear (TP-sharded), two RMSNorms per layer (the QK norm has no weight),
    Llama4MoE on (i + 1) % interleave_moe_layer_step == 0 (GateLinear router replicated,
    FusedMoE experts of intermediate_size split by TP or whole per EP rank, shared expert
    LlamaMLP TP-sharded), LlamaMLP of intermediate_size_mlp elsewhere; vocabulary padded to
    64 and split by TP for the embedding and the untied lm_head."""
    h, hd, layers = t["hidden_size"], t["head_dim"], t["num_hidden_layers"]
    heads, kv = t["num_attention_heads"] // tp, max(1, t["num_key_value_heads"] // tp)
    experts, inter, mlp = t["num_local_experts"], t["intermediate_size"], t["intermediate_size_mlp"]
    step = t["interleave_moe_layer_step"]
    attn = h * (heads + 2 * kv) * hd + heads * hd * h
    routed = (experts // ep) * 3 * h * inter if ep > 1 else experts * 3 * h * inter / tp
    moe = routed + 3 * h * inter / tp + h * experts
    dense = 3 * h * mlp / tp
    total = 0.0
    for i in range(layers):
        total += attn + 2 * h + (moe if (i + 1) % step == 0 else dense)
    rows = math.ceil(t["vocab_size"] / 64) * 64 / tp
    return float(total + 2 * rows * h + h)


@pytest.mark.parametrize("name", [SCOUT, MAVERICK])
def test_total_and_active_parameters_match_the_card(name: str) -> None:
    spec = load_model(name)
    total = _eager(spec).weights_gib * GIB / 2 - _rotary_params(spec)
    # Active: the same model with only the top-k (1) expert per MoE layer.
    one = replace(spec, num_experts=spec.num_experts_per_tok)
    active = _eager(one).weights_gib * GIB / 2 - _rotary_params(spec)
    card_total, card_active = CARDS[name]
    assert total == pytest.approx(card_total, rel=0.02), f"{total / 1e9:.2f}B"
    assert active == pytest.approx(card_active, rel=0.02), f"{active / 1e9:.2f}B"


@pytest.mark.parametrize("name", [SCOUT, MAVERICK])
@pytest.mark.parametrize(("tp", "ep"), [(1, False), (4, False), (8, False), (8, True)])
def test_weights_follow_vllms_layers_and_sharding(name: str, tp: int, ep: bool) -> None:
    t = _text(name)
    spec = load_model(name)
    est = estimate(
        spec,
        BIG,
        Settings(tensor_parallel_size=tp, enable_expert_parallel=ep, max_model_len=4096, enforce_eager=True),
    )
    expected = _expected_params(t, tp, tp if ep else 1) + _rotary_params(spec)
    assert est.weights_gib * GIB / 2 == pytest.approx(expected, rel=1e-9)


def test_moe_layers_and_intermediate_sizes() -> None:
    scout, maverick = load_model(SCOUT), load_model(MAVERICK)
    assert [scout.is_moe_layer(i) for i in range(48)] == [True] * 48
    # interleave_moe_layer_step 2: layers 1, 3, ..., 47 are MoE, the others dense.
    assert [i for i in range(48) if maverick.is_moe_layer(i)] == list(range(1, 48, 2))
    for spec in (scout, maverick):
        assert (spec.intermediate_size, spec.moe_intermediate_size) == (16384, 8192)
        assert (spec.num_shared_experts, spec.shared_expert_intermediate_size, spec.num_experts_per_tok) == (1, 8192, 1)
        assert not spec.qk_norm  # RMSNorm(has_weight=False): nothing to load


def test_interleave_step_zero_builds_no_moe_layer() -> None:
    t = {**_text(MAVERICK), "interleave_moe_layer_step": 0}
    spec = spec_from_config({"model_type": "llama4", "text_config": t}, "x")
    assert not spec.is_moe and not any(spec.is_moe_layer(i) for i in range(48))
    est = _eager(spec)
    assert est.weights_gib * GIB / 2 == pytest.approx(
        _expected_params({**t, "interleave_moe_layer_step": 10**6}) + _rotary_params(spec), rel=1e-9
    )


def test_layer_types_from_no_rope_layers() -> None:
    spec = load_model(SCOUT)
    # No no_rope_layers in config.json: transformers' default, a NoPE layer every 4 layers.
    assert spec.layer_types == tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48))
    assert spec.attention_chunk_size == 8192
    t = _text(SCOUT)
    flags = [0 if i < 6 else 1 for i in range(48)]
    own = spec_from_config({"model_type": "llama4", "text_config": {**t, "no_rope_layers": flags}}, "x")
    assert own.layer_types == ("full",) * 6 + ("chunked",) * 42
    interval = spec_from_config({"model_type": "llama4", "text_config": {**t, "no_rope_layer_interval": 6}}, "x")
    assert interval.layer_types.count("full") == 8
    off = spec_from_config({"model_type": "llama4", "text_config": {**t, "attention_chunk_size": None}}, "x")
    assert off.layer_types == ("full",) * 48 and off.attention_chunk_size == 0
    absent = {k: v for k, v in t.items() if k != "attention_chunk_size"}
    assert spec_from_config({"model_type": "llama4", "text_config": absent}, "x").attention_chunk_size == 8192


@pytest.mark.parametrize("bad", [[1] * 47, "1,1,1,0", [2] * 48, [True] * 48])
def test_bad_no_rope_layers_are_refused(bad: Any) -> None:
    t = {**_text(SCOUT), "no_rope_layers": bad}
    with pytest.raises(PlanError, match="no_rope_layers"):
        spec_from_config({"model_type": "llama4", "text_config": t}, "x")


def _kv_case(hybrid: bool, length: int, mbt: int = 8192, tp: int = 4) -> tuple[Estimate, int, int]:
    """The estimate and (blocks, blocks per request) from ChunkedLocalAttentionSpec's rule: a
    chunk plus vLLM's max_in_flight_tokens, here async scheduling with Model Runner V2 on one
    PP stage: pp + 1 = 2 batches of max_num_batched_tokens (VllmConfig.max_concurrent_batches)."""
    spec = load_model(SCOUT)
    settings = Settings(
        tensor_parallel_size=tp,
        max_model_len=length,
        max_num_batched_tokens=mbt,
        chunked_local_attn_hybrid_kv=hybrid,
    )
    est = estimate(spec, Device("H100-SXM", 79.19), settings)
    page = 16 * 2 * (8 // tp) * 128 * 2  # block x K+V x KV heads per rank x head_dim x bf16
    available = est.ranks[0].available_kv_gib * GIB
    if hybrid:
        # 36 chunked + 12 full layers: groups of 12 layers (3 chunked, 1 full) share one block id.
        blocks = int(available // (12 * page))
        need = 3 * math.ceil(min(8192 + 2 * mbt, length) / 16) + math.ceil(length / 16)
    else:
        blocks = int(available // (48 * page))
        need = math.ceil(length / 16)
    return est, blocks, need


@pytest.mark.parametrize("length", [4096, 16384, 131072, 1_000_000])
@pytest.mark.parametrize("hybrid", [True, False])
def test_kv_blocks_tokens_and_concurrency(hybrid: bool, length: int) -> None:
    est, blocks, need = _kv_case(hybrid, length)
    assert est.num_gpu_blocks == blocks
    assert est.max_concurrency == pytest.approx(blocks / need)
    # get_kv_cache_capacity: int(concurrency x max_model_len).
    assert est.kv_cache_tokens == int(blocks / need * length)
    if hybrid:
        page = 16 * 2 * 2 * 128 * 2  # TP=4: 2 KV heads per rank
        # A chunk of 8192 + 2 x 8192 in-flight tokens per chunked group.
        assert est.parts()["kv.chunked_bytes_per_request"] == 3 * math.ceil(min(24576, length) / 16) * 12 * page
    else:
        assert "kv.chunked_bytes_per_request" not in est.parts()


def test_chunked_layers_hold_far_less_than_full_ones_at_long_length() -> None:
    on, _, _ = _kv_case(True, 1_000_000)
    off, _, _ = _kv_case(False, 1_000_000)
    # 12 full layers instead of 48 at that length: close to 4x the tokens.
    assert 3.5 < on.kv_cache_tokens / off.kv_cache_tokens < 4.0
    assert on.ranks[0].available_kv_gib == off.ranks[0].available_kv_gib


def test_cuda_graphs_are_piecewise_only() -> None:
    spec = load_model(SCOUT)
    dense = replace(spec, layer_types=("full",) * 48, attention_chunk_size=0)
    settings = Settings(tensor_parallel_size=4, max_model_len=8192)
    dev = Device("H100-SXM", 79.19)
    chunked = estimate(spec, dev, settings).ranks[0].cuda_graph_gib
    assert chunked > 0
    assert estimate(dense, dev, settings).ranks[0].cuda_graph_gib == pytest.approx(2 * chunked)


def test_the_environment_variable() -> None:
    name = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
    assert chunked_local_attn_hybrid_kv({}) is True
    assert chunked_local_attn_hybrid_kv({name: "0"}) is False
    assert chunked_local_attn_hybrid_kv({name: "2"}) is True
    with pytest.raises(PlanError, match="not an integer"):
        chunked_local_attn_hybrid_kv({name: "yes"})


def test_cli_estimate_reads_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", SCOUT, "--gpu", "H100-SXM", "-tp", "4", "--max-model-len", "131072", "--json"]
    results = []
    for extra in ([], ["--env", "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0"]):
        assert main(base + extra) == 0
        results.append(json.loads(capsys.readouterr().out))
    on, off = results
    # Groups of 12 layers instead of one of 48: four times the blocks from the same memory.
    assert on["num_gpu_blocks"] // 4 == off["num_gpu_blocks"]
    assert on["kv_cache_tokens"] > 2 * off["kv_cache_tokens"]
    assert any("36 of 48 layers" in line and "ChunkedLocalAttentionSpec" in line for line in on["assumptions"])
    assert any("allocated as full attention" in line for line in off["assumptions"])
    assert any("24 of 48" in line for line in json.loads(_run(capsys, MAVERICK))["assumptions"])


def _run(capsys: pytest.CaptureFixture[str], model: str) -> str:
    assert main(["estimate", "--model", model, "--gpu", "H200", "-tp", "8", "--max-model-len", "8192", "--json"]) == 0
    return capsys.readouterr().out


def test_other_models_are_unchanged() -> None:
    # A model without chunked layers gets no chunked parts, assumptions or graph change.
    est = estimate(load_model("Qwen/Qwen2.5-7B-Instruct"), Device("H100-SXM", 79.19), Settings(max_model_len=8192))
    assert est.assumptions == [] and "kv.chunked_bytes_per_request" not in est.parts()
