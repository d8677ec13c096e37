"""Model Runner V2 estimated no CUDA graphs up to vLLM 0.28 (vllm_fleet/accounting/runner.py):
where vLLM ran it by default, the graphs came on top of the budget, as before 0.21."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.runner import v2_without_graph_estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.catalog import lookup_model
from vllm_fleet.model.spec import ModelSpec, spec_from_config

H100 = Device("H100-SXM", 79.19, "cuda", 9, None, 90)


def _spec(name: str) -> ModelSpec:
    cfg = lookup_model(name)
    assert cfg is not None
    return spec_from_config(cfg, name)


def _dense(arch: str, model_type: str, **extra: Any) -> ModelSpec:
    cfg = {"architectures": [arch], "model_type": model_type, "hidden_size": 1024, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048, "vocab_size": 32000,
           "max_position_embeddings": 4096, "torch_dtype": "bfloat16", **extra}  # fmt: skip
    return spec_from_config(cfg, arch)


@pytest.mark.parametrize(
    ("version", "arch", "model_type", "v2"),
    [
        ("0.21.0", "Qwen3ForCausalLM", "qwen3", False),  # V2 by VLLM_USE_V2_MODEL_RUNNER only
        ("0.22.0", "Qwen3ForCausalLM", "qwen3", True),
        ("0.22.0", "LlamaForCausalLM", "llama", False),
        ("0.23.0", "LlamaForCausalLM", "llama", True),
        ("0.24.0", "Qwen2ForCausalLM", "qwen2", False),  # not in 0.24's list
        ("0.25.1", "Qwen2ForCausalLM", "qwen2", True),  # every dense model from 0.25
        ("0.28.0", "Gemma3ForCausalLM", "gemma3_text", True),
        ("0.29.0", "Qwen3ForCausalLM", "qwen3", False),  # V2 estimates its graphs from 0.29
        ("0.32.0", "LlamaForCausalLM", "llama", False),
    ],
)
def test_which_releases_ran_v2_without_an_estimate(version: str, arch: str, model_type: str, v2: bool) -> None:
    spec = _dense(arch, model_type)
    assert v2_without_graph_estimate(spec, Settings(vllm_version=version), False, None) is v2


def test_moe_hybrids_quantization_and_speculative_methods_went_back_to_v1() -> None:
    moe = _spec("Qwen/Qwen3-30B-A3B")
    assert moe.is_moe and not v2_without_graph_estimate(moe, Settings(vllm_version="0.26.0"), False, None)
    # 0.22 / 0.23 kept quantized checkpoints on V1; 0.24 did not ask.
    llama = _dense("LlamaForCausalLM", "llama")
    assert not v2_without_graph_estimate(llama, Settings(vllm_version="0.23.0"), True, None)
    assert v2_without_graph_estimate(llama, Settings(vllm_version="0.24.0"), True, None)
    # A catalog config without architectures is taken by its model_type.
    assert v2_without_graph_estimate(_spec("Qwen/Qwen3-8B"), Settings(vllm_version="0.22.0"), False, None)
    # ngram and EAGLE3 across pipeline stages ran V1.
    assert not v2_without_graph_estimate(llama, Settings(vllm_version="0.26.0"), False, "ngram")
    pp = Settings(vllm_version="0.26.0", pipeline_parallel_size=2)
    assert not v2_without_graph_estimate(llama, pp, False, "eagle3")
    assert v2_without_graph_estimate(llama, Settings(vllm_version="0.26.0"), False, "eagle3")


def test_the_pool_keeps_the_graphs_on_v2_releases() -> None:
    """Qwen3-8B on 0.26 (V2, no estimate) plans a pool larger by the graphs than on 0.29 (V2 with
    its estimate), the budget and the rest alike, and says why."""
    spec = _spec("Qwen/Qwen3-8B")
    v26 = estimate(spec, H100, Settings(max_model_len=8192, vllm_version="0.26.0"))
    v29 = estimate(spec, H100, Settings(max_model_len=8192, vllm_version="0.29.0"))
    graphs = v29.ranks[0].cuda_graph_gib
    assert graphs > 0
    assert v26.ranks[0].available_kv_gib - v29.ranks[0].available_kv_gib == pytest.approx(graphs, rel=1e-6)
    assert any("Model Runner V2 estimates none" in n for n in v26.notes)
    assert not any("Model Runner V2" in n for n in v29.notes)
