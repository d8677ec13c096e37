"""GLM-5 (glm_moe_dsa: DeepSeek V3.2's MLA and DSA indexer in vLLM 0.32's deepseek_v2.py): the
fp8 KV cache vLLM takes for it on SM10x, and IndexCache's layers without an indexer (their KV
layout is checked against vLLM in tests/oracle/test_kv_oracle.py, deepseek_v32_ic)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.spec import spec_from_config

GLM5: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 1024,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 2048,
    "moe_intermediate_size": 256, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 192, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32, "index_head_dim": 128,
    "vocab_size": 154880, "max_position_embeddings": 202752, "torch_dtype": "bfloat16",
}  # fmt: skip
B200 = Device("B200", 178.36, "cuda", 10, None, 100)
H200 = Device("H200", 139.81, "cuda", 9, None, 90)


def test_an_auto_kv_cache_is_fp8_on_sm10x_only() -> None:
    spec = spec_from_config(GLM5, "glm5")
    settings = Settings(max_model_len=8192)
    blackwell, hopper = estimate(spec, B200, settings), estimate(spec, H200, settings)
    # fp8_ds_mla (656 bytes) against bf16 MLA (576 x 2), plus the indexer's 132, per layer.
    assert blackwell.ranks[0].kv_bytes_per_token == 8 * (656 + 132)
    assert hopper.ranks[0].kv_bytes_per_token == 8 * (1152 + 132)
    assert any("fp8 KV cache" in n for n in blackwell.notes) and not any("fp8 KV cache" in n for n in hopper.notes)
    # The same model named DeepSeek V3.2 keeps bf16 there.
    v32 = estimate(spec_from_config(dict(GLM5, model_type="deepseek_v32"), "v32"), B200, settings)
    assert v32.ranks[0].kv_bytes_per_token == 8 * (1152 + 132)


@pytest.mark.parametrize(
    ("keys", "skipped"),
    [
        ({}, ()),
        ({"index_topk_freq": 2}, (2, 4, 6)),  # max(i - 2 + 1, 0) % 2
        ({"index_topk_freq": 4, "index_skip_topk_offset": 1}, (1, 2, 3, 5, 6, 7)),
        ({"index_topk_pattern": "FFSFSSFS"}, (2, 4, 5, 7)),
    ],
)
def test_indexcache_layers_hold_no_indexer(keys: dict[str, Any], skipped: tuple[int, ...]) -> None:
    spec = spec_from_config(dict(GLM5, **keys), "glm5")
    assert spec.index_skip == skipped
    full = estimate(spec_from_config(GLM5, "glm5"), H200, Settings(max_model_len=8192))
    some = estimate(spec, H200, Settings(max_model_len=8192))
    assert full.ranks[0].kv_bytes_per_token - some.ranks[0].kv_bytes_per_token == 132 * len(skipped)
    # Each skipped layer's indexer weights: wq_b, the fused wk + weights_proj, k_norm.
    indexer = (512 * 32 * 128 + 1024 * (128 + 32)) * 2 + 2 * 128 * 4
    assert (full.ranks[0].weights_gib - some.ranks[0].weights_gib) * (1 << 30) == pytest.approx(
        indexer * len(skipped), rel=1e-9
    )
