"""The KV cache of the 2026 architectures: sliding-window / full hybrids, Mamba and linear
attention hybrids, DeepSeek V3.2's indexer.

Every expected number is derived here from the rules of vLLM 0.32's code, written out
independently of the planner (kv_cache_interface.py's max_memory_usage_bytes,
kv_cache_utils.py's grouping, Platform._align_hybrid_block_size, the mamba state shapes);
tests/oracle/test_kv_oracle.py checks the same figures against vLLM itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_fleet.accounting import options
from vllm_fleet.accounting.memory import Estimate, estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.errors import PlanError
from vllm_fleet.model.spec import ModelSpec, spec_from_config

H100 = Device("H100-SXM", 79.19, "cuda", 9)
MEM = 3 << 30  # --kv-cache-memory-bytes: the KV pool every case is sized with
BF16 = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run(cfg: dict[str, Any], **kw: Any) -> tuple[ModelSpec, Estimate]:
    spec = spec_from_config(cfg, cfg["model_type"])
    settings = Settings(kv_cache_memory_bytes=MEM, max_num_batched_tokens=2048, **kw)
    return spec, estimate(spec, H100, settings)


def attention_cfg(model_type: str, layers: int, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    cfg.update(extra)
    return cfg


def capacity(
    groups: list[tuple[str, int]], layers_per_group: int, page: int, mml: int, block: int, extra: int
) -> dict[str, Any]:
    """vLLM's pool for ``groups`` (kind, window) of equal size: bytes per block = one group's
    pages; a request holds cdiv(len, block) blocks per full group, cdiv(min(window - 1 +
    in-flight, len), block) + 1 per sliding group (``extra`` = max_in_flight_tokens)."""
    blocks = MEM // (layers_per_group * page)

    def need(length: int) -> int:
        total = 0
        for kind, window in groups:
            if kind == "sliding":
                total += cdiv(min(window - 1 + extra, length), block) + 1
            else:
                total += cdiv(length, block)
        return total

    conc = blocks / need(mml)
    fit = max(n for n in range(0, mml + 1, 1) if n == 0 or need(n) <= blocks - 1) if need(mml) > blocks - 1 else mml
    return {"blocks": blocks, "conc": conc, "tokens": int(conc * mml), "fit": fit}


# ---------------------------------------------------------------------------
# Sliding window and full attention under the hybrid allocator
# ---------------------------------------------------------------------------


def test_gpt_oss_pattern_two_groups_and_in_flight_window() -> None:
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(6)]
    _, est = run(attention_cfg("gpt_oss", 6, sliding_window=128, layer_types=types), max_model_len=32768)
    page = 2 * 4 * 64 * BF16 * 16  # K and V of 4 heads x 64, 16 tokens
    # Async scheduling with Model Runner V2: pp + 1 = 2 batches of 2048 tokens in flight.
    want = capacity([("sliding", 128), ("full", 0)], 3, page, 32768, 16, 2 * 2048)
    assert est.num_gpu_blocks == want["blocks"]
    assert est.max_concurrency == pytest.approx(want["conc"])
    assert est.kv_cache_tokens == want["tokens"]
    assert est.parts()["kv.groups"] == 2
    assert any("sliding window 128" in line for line in est.assumptions)


def test_gemma3_five_local_to_one_global_makes_six_groups() -> None:
    cfg = attention_cfg("gemma3_text", 12, sliding_window=1024, sliding_window_pattern=6)
    spec, est = run(cfg, max_model_len=32768)
    assert spec.layer_types.count("full") == 2
    page = 2 * 4 * 64 * BF16 * 16
    # 10 sliding + 2 full layers: groups of 2 layers, 5 sliding groups and 1 full.
    want = capacity([("sliding", 1024)] * 5 + [("full", 0)], 2, page, 32768, 16, 2 * 2048)
    assert (est.num_gpu_blocks, est.kv_cache_tokens) == (want["blocks"], want["tokens"])
    assert est.max_model_len_fit == want["fit"]


def test_groups_of_the_larger_bucket_when_below_one_and_a_half_times_the_smaller() -> None:
    # 13 full + 12 sliding: vLLM pads to (13, 13) rather than splitting full into 2 groups.
    types = ["full_attention"] * 13 + ["sliding_attention"] * 12
    _, est = run(attention_cfg("gpt_oss", 25, sliding_window=128, layer_types=types), max_model_len=32768)
    page = 2 * 4 * 64 * BF16 * 16
    want = capacity([("full", 0), ("sliding", 128)], 13, page, 32768, 16, 2 * 2048)
    assert est.num_gpu_blocks == want["blocks"]
    assert est.parts()["kv.groups"] == 2


@pytest.mark.parametrize(
    ("full", "sliding", "version", "groups", "per_group"),
    [
        (13, 10, "0.32.0", 2, 13),  # 13 < 1.5 x 10: groups of 13 (the sliding bucket padded)
        (13, 10, "0.18.0", 2, 13),
        (13, 10, "0.17.0", 3, 10),  # 13 >= 1.25 x 10: groups of 10, full split in two
        (13, 12, "0.14.0", 2, 13),  # 13 < 1.25 x 12
        (13, 12, "0.11.0", 3, 12),  # 0.11: always the smallest bucket
    ],
)
def test_the_group_size_rule_follows_the_release(
    full: int, sliding: int, version: str, groups: int, per_group: int
) -> None:
    """_get_kv_cache_groups_uniform_page_size's group size by release (read in the sdists):
    the smallest bucket's layer count, or the largest's when below 1.5x the smallest (0.18
    on), 1.25x (0.12 to 0.17), never (0.11)."""
    types = ["full_attention"] * full + ["sliding_attention"] * sliding
    _, est = run(
        attention_cfg("gpt_oss", full + sliding, sliding_window=128, layer_types=types),
        max_model_len=32768,
        vllm_version=version,
    )
    page = 2 * 4 * 64 * BF16 * 16
    assert est.parts()["kv.groups"] == groups
    assert est.num_gpu_blocks == MEM // (per_group * page)


def test_older_release_prints_blocks_per_group_times_block() -> None:
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(6)]
    _, est = run(
        attention_cfg("gpt_oss", 6, sliding_window=128, layer_types=types), max_model_len=32768, vllm_version="0.19.0"
    )
    page = 2 * 4 * 64 * BF16 * 16
    blocks = MEM // (3 * page)
    # Before 0.21: num_blocks // len(groups) x min block size; one batch in flight.
    assert est.kv_cache_tokens == blocks // 2 * 16
    need = cdiv(32768, 16) + cdiv(127 + 2048, 16) + 1
    assert est.max_concurrency == pytest.approx(blocks / need)


def test_uniform_sliding_model_keeps_one_group() -> None:
    # Mistral 7B v0.1: every layer slides with the same window: one group, window-bounded.
    _, est = run(attention_cfg("mistral", 4, sliding_window=4096), max_model_len=32768)
    page = 2 * 4 * 64 * BF16 * 16
    blocks = MEM // (4 * page)
    assert est.num_gpu_blocks == blocks
    assert est.max_concurrency == pytest.approx(blocks / (cdiv(4095 + 2 * 2048, 16) + 1))
    assert "kv.groups" not in est.parts()


# ---------------------------------------------------------------------------
# Mamba and linear-attention hybrids
# ---------------------------------------------------------------------------

QWEN3_NEXT = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 8,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_value_head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def gdn_state(tp: int) -> int:
    """gated_delta_net_state_shape: conv (kernel - 1, (2 K + V) / tp), ssm (v_heads / tp,
    v_dim, k_dim), both bf16 (mamba_cache_dtype auto)."""
    conv_dim = 2 * 32 * 4 + 32 * 8
    return (3 * conv_dim // tp + (8 // tp) * 32 * 32) * BF16


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_next_attention_block_aligned_to_the_gdn_state(tp: int) -> None:
    spec, est = run(QWEN3_NEXT, tensor_parallel_size=tp, max_model_len=32768)
    assert spec.layer_types == ("linear_attention",) * 3 + ("full",) + ("linear_attention",) * 3 + ("full",)
    token = 2 * (2 // tp) * 64 * BF16
    state = gdn_state(tp)
    block = 16 * cdiv(state, 16 * token)
    assert est.block_size == block
    page = block * token
    # 2 full + 6 linear: groups of 2, 1 full + 3 mamba groups; prefix caching on = "align"
    # mode, 2 blocks per request per mamba group.
    blocks = MEM // (2 * page)
    need = cdiv(32768, block) + 3 * 2
    assert est.num_gpu_blocks == blocks
    assert est.max_concurrency == pytest.approx(blocks / need)
    assert est.kv_cache_tokens == int(blocks / need * 32768)
    assert est.parts()["kv.ssm_state_bytes_per_seq"] == 6 * state
    assert est.parts()["kv.attention_block_size"] == block
    assert est.kv_bytes_per_token == 2 * token


def test_without_prefix_caching_one_block_per_mamba_group() -> None:
    _, est = run(QWEN3_NEXT, max_model_len=32768, enable_prefix_caching=False)
    block = est.block_size
    assert est.max_concurrency == pytest.approx(est.num_gpu_blocks / (cdiv(32768, block) + 3))


NEMOTRON_H = {
    "model_type": "nemotron_h",
    "num_hidden_layers": 8,
    "hybrid_override_pattern": "M-M*-M-E",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def mamba2_state(tp: int, heads: int, head_dim: int, groups: int, state: int, conv: int, ssm_bytes: int) -> int:
    """mamba2_state_shape: conv (conv - 1, (I + 2 G N) / tp) in bf16, ssm (H / tp, P, N)."""
    inner = heads * head_dim
    groups += 0 if groups % tp == 0 else tp - groups
    return (conv - 1) * (inner + 2 * groups * state) // tp * BF16 + heads // tp * head_dim * state * ssm_bytes


def test_nemotron_h_pattern_fp32_ssm_state_and_mlp_blocks_without_cache() -> None:
    spec, est = run(NEMOTRON_H, max_model_len=32768)
    assert spec.layer_types == ("mamba", "mlp", "mamba", "full", "mlp", "mamba", "mlp", "moe")
    state = mamba2_state(1, 8, 32, 2, 16, 4, 4)  # NemotronH: mamba_ssm_cache_dtype float32
    token = 2 * 2 * 64 * BF16
    block = 16 * cdiv(state, 16 * token)
    assert est.block_size == block
    # 1 attention layer, 3 mamba: groups of 1 (4 groups), one page per block.
    blocks = MEM // (block * token)
    assert est.num_gpu_blocks == blocks
    assert est.max_concurrency == pytest.approx(blocks / (cdiv(32768, block) + 3 * 2))
    assert est.parts()["kv.ssm_state_bytes_per_seq"] == 3 * state


def test_nemotron_h_weights_count_each_block_once() -> None:
    spec = spec_from_config(NEMOTRON_H, "nemotron_h")
    h, v = 256, 1024  # the vocabulary padded to 64 (VocabParallelEmbedding)
    inner, groups, n, heads, conv = 8 * 32, 2, 16, 8, 4
    conv_dim = inner + 2 * groups * n
    mamba = h * (inner + conv_dim + heads) + conv_dim * conv + conv_dim + 3 * heads + inner + inner * h
    attn = h * (4 * 64 + 2 * 2 * 64) + 4 * 64 * h
    mlp = 2 * h * 512  # up + down, relu^2
    moe = 4 * 2 * h * 64 + h * 4  # experts (up + down) and router
    elems = 3 * mamba + attn + 3 * mlp + moe + 8 * h + 2 * v * h + h
    # A is fp32 (2 bytes more per element than bf16), e_score_correction_bias fp32.
    want = elems * BF16 + 3 * heads * 2 + 4 * 4
    # Nemotron-H's attention has no position embedding: no rotary cache.
    est = estimate(spec, H100, Settings(max_model_len=4096))
    assert est.weights_gib * (1 << 30) == pytest.approx(want, rel=1e-9)


def test_nemotron_h_latent_moe_runs_the_experts_in_the_latent_width() -> None:
    """NemotronHMoE with moe_latent_size (Nemotron 3 Super / Ultra): routed experts of latent x
    intermediate, between fc1_latent_proj (hidden -> latent) and fc2_latent_proj (latent -> hidden),
    both replicated; the router and shared experts stay on the hidden size."""
    plain = estimate(spec_from_config(NEMOTRON_H, "nh"), H100, Settings(max_model_len=4096))
    latent_cfg = dict(NEMOTRON_H, moe_latent_size=64)
    spec = spec_from_config(latent_cfg, "nh")
    assert spec.moe_latent_size == 64
    latent = estimate(spec, H100, Settings(max_model_len=4096))
    h, k, inter, experts = 256, 64, 64, 4
    delta = experts * 2 * inter * (k - h) + 2 * h * k  # experts narrower, two projections more
    assert (latent.weights_gib - plain.weights_gib) * (1 << 30) == pytest.approx(delta * BF16, rel=1e-9)
    # TP=2 shards the experts, not the replicated latent projections.
    tp2 = estimate(spec, H100, Settings(max_model_len=4096, tensor_parallel_size=2))
    tp2_plain = estimate(spec_from_config(NEMOTRON_H, "nh"), H100, Settings(max_model_len=4096, tensor_parallel_size=2))
    tp2_delta = experts * 2 * inter * (k - h) / 2 + 2 * h * k
    assert (tp2.weights_gib - tp2_plain.weights_gib) * (1 << 30) == pytest.approx(tp2_delta * BF16, rel=1e-9)


def test_nemotron_3_super_totals_its_cards_120b() -> None:
    """Nemotron 3 Super 120B-A12B's config.json values as public repositories check them (hidden
    4,096; 88 layers: 40 Mamba, 40 latent MoE, 8 attention; 512 experts of 2,688 in a 1,024
    latent, top-22, a 5,376 shared expert): 120 billion parameters as its card says (the experts
    at the hidden size made 460 billion). The pattern's order is not known here, only its counts,
    which is all the weights depend on."""
    cfg = dict(
        NEMOTRON_H, hidden_size=4096, num_hidden_layers=88, hybrid_override_pattern=("ME" * 5 + "*") * 8,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, vocab_size=131072, n_routed_experts=512,
        num_experts_per_tok=22, moe_intermediate_size=2688, moe_latent_size=1024, n_shared_experts=1,
        moe_shared_expert_intermediate_size=5376, intermediate_size=21504, mamba_num_heads=128, mamba_head_dim=64,
        n_groups=8, ssm_state_size=128, tie_word_embeddings=False,
    )  # fmt: skip
    big = Device("B300", 4000.0, "cuda", 10, None, 103)
    est = estimate(spec_from_config(cfg, "super"), big, Settings(max_model_len=4096))
    assert est.weights_gib * (1 << 30) / BF16 == pytest.approx(120e9, rel=0.01)


GRANITE_H = {
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "shared_intermediate_size": 512,
    "num_local_experts": 0,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 32,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("tp", [1, 2])
def test_granite_h_mamba2_state_replicates_a_single_group(tp: int) -> None:
    spec, est = run(GRANITE_H, tensor_parallel_size=tp, max_model_len=32768)
    assert spec.mamba_intermediate == 512 and spec.intermediate_size == 512  # dense: the shared MLP
    state = mamba2_state(tp, 8, 64, 1, 32, 4, BF16)
    token = 2 * (2 // tp) * 64 * BF16
    assert est.block_size == 16 * cdiv(state, 16 * token)
    assert est.parts()["kv.ssm_state_bytes_per_seq"] == 3 * state


def test_jamba_mamba1_state_and_layer_pattern() -> None:
    cfg = {
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    spec, est = run(cfg, max_model_len=32768)
    assert spec.layer_types.index("full") == 4 and spec.layer_types.count("mamba") == 7
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    inner = 2 * 256
    state = (3 * inner + inner * 16) * BF16  # mamba1_state_shape: (conv - 1, I), (I, N)
    assert est.parts()["kv.ssm_state_bytes_per_seq"] == 7 * state


def test_falcon_h1_every_layer_has_attention_and_mamba() -> None:
    cfg = {
        "model_type": "falcon_h1",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "mamba_d_ssm": 512,
        "mamba_n_heads": 8,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    _, est = run(cfg, max_model_len=32768)
    block = est.block_size
    page = block * 2 * 2 * 64 * BF16
    # 4 attention + 4 mamba layers: 2 groups of 4.
    assert est.num_gpu_blocks == MEM // (4 * page)
    assert est.max_concurrency == pytest.approx(est.num_gpu_blocks / (cdiv(32768, block) + 2))


def test_hybrid_layer_types_are_checked() -> None:
    bad = dict(GRANITE_H, layer_types=["mamba", "conv", "mamba", "attention"])
    with pytest.raises(PlanError, match="unknown layer type"):
        spec_from_config(bad, "granite")
    short = dict(NEMOTRON_H, hybrid_override_pattern=5)
    with pytest.raises(PlanError, match="hybrid_override_pattern"):
        spec_from_config(short, "nemotron")


# ---------------------------------------------------------------------------
# DeepSeek V3.2 sparse attention
# ---------------------------------------------------------------------------

DSV32 = {
    "model_type": "deepseek_v32",
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1024,
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 256,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "index_topk": 2048,
    "index_n_heads": 16,
    "index_head_dim": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(("kv_dtype", "latent"), [("auto", 576 * BF16), ("fp8", 656)])
def test_deepseek_v32_indexer_cache_next_to_the_latent(kv_dtype: str, latent: int) -> None:
    _, est = run(DSV32, max_model_len=32768, kv_cache_dtype=kv_dtype)
    indexer = 128 + 128 // 128 * 4  # fp8 keys and one fp32 scale per 128
    assert est.block_size == 64
    assert est.kv_bytes_per_token == 4 * (latent + indexer)
    assert est.num_gpu_blocks == MEM // (4 * (latent + indexer) * 64)
    assert est.parts()["kv.indexer_bytes_per_token"] == 4 * indexer


def test_deepseek_v32_indexer_weights() -> None:
    with_indexer = spec_from_config(DSV32, "v32")
    without = spec_from_config({k: v for k, v in DSV32.items() if not k.startswith("index_")}, "v3")
    settings = Settings(max_model_len=4096, tensor_parallel_size=2, max_num_batched_tokens=4096)
    extra = estimate(with_indexer, H100, settings).weights_gib - estimate(without, H100, settings).weights_gib
    # Per layer, replicated: wq_b (q_lora x heads x dim), wk + weights_proj (h x (dim +
    # heads)) in bf16, k_norm weight and bias in fp32; once: the int32 top-k index buffer
    # of max_num_batched_tokens x index_topk.
    per_layer = (256 * 16 * 128 + 512 * (128 + 16)) * BF16 + 2 * 128 * 4
    assert extra * (1 << 30) == pytest.approx(4 * per_layer + 4096 * 2048 * 4)


def test_qwen3_5_is_qwen3_next_with_layer_types_and_a_float32_state() -> None:
    """Qwen3.5 (text_config model_type qwen3_5_text) builds Qwen3-Next's layers: its layer_types'
    linear_attention layers hold a Gated DeltaNet state, not KV, and the state's SSM part is the
    config's mamba_ssm_dtype (float32) under an "auto" --mamba-ssm-cache-dtype, as
    Qwen3_5ForConditionalGenerationConfig sets it (tests/oracle/test_kv_oracle.py checks the blocks
    against vLLM's own code)."""
    text = {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320,
        "max_position_embeddings": 262144, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32", "torch_dtype": "bfloat16",
    }  # fmt: skip
    cfg = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5", "text_config": text}
    spec = spec_from_config(cfg, "qwen3.5-27b-shaped")
    assert [spec.layer_type(i) for i in range(4)] == ["linear_attention"] * 3 + ["full"]
    assert spec.mamba_ssm_cache_dtype == "float32"
    est = estimate(spec, Device("H20", 95.0, "cuda", 9), Settings(max_model_len=32768, max_num_seqs=16))
    # 16 full-attention layers x 2 x 4 KV heads x 256 x 2 bytes (the 48 GDN layers hold no KV per token).
    assert est.kv_bytes_per_token == 16 * 2 * 4 * 256 * 2
    # Per GDN layer: conv (2 x 16 x 128 + 48 x 128) x 3 x 2 bytes + SSM 48 x 128 x 128 x 4 bytes (float32).
    assert est.parts()["kv.ssm_state_bytes_per_seq"] == 48 * ((2 * 16 * 128 + 48 * 128) * 3 * 2 + 48 * 128 * 128 * 4)
    # LoRA: the attention adapters sit on the 16 attention layers only, their q slice packing a gate
    # beside every query head (attn_output_gate: 2 x 24 x 256); the MLPs on all 64.
    lo = options._Lora(1, 8, 1, False, BF16)
    lora = Settings(max_model_len=32768, enable_lora=True, max_loras=1, max_lora_rank=8)
    attn = lo.column(5120, [2 * 24 * 256, 4 * 256, 4 * 256]) + lo.row(24 * 256, 5120)
    mlp = lo.column(5120, [17408, 17408]) + lo.row(17408, 5120)
    layers = list(range(64))
    assert options.lora_bytes(spec, layers, False, False, 1, 1, lora, BF16) == pytest.approx(16 * attn + 64 * mlp)


@pytest.mark.parametrize(
    "cfg",
    [
        {**NEMOTRON_H, "architectures": ["NemotronHPuzzleForCausalLM"]},
        {**NEMOTRON_H, "block_configs": [{"block_type": "mamba"}] * NEMOTRON_H["num_hidden_layers"]},
        {**NEMOTRON_H, "model_type": "nemotron_h_puzzle", "block_configs": [{"block_type": "mamba"}]},
    ],
)
def test_nemotron_h_puzzle_is_refused_with_its_reason(cfg: dict[str, Any]) -> None:
    """NemotronHPuzzleForCausalLM: each layer from its block_configs entry (vLLM 0.32 asks the
    checkpoint's get_nemotron_h_config_for_layer), which one top-level config cannot stand for."""
    with pytest.raises(PlanError, match="block_configs") as err:
        spec_from_config(cfg, "puzzle")
    assert "kv_cache_memory_bytes" in err.value.fix


def test_lora_on_nemotron_h_follows_its_blocks() -> None:
    """Nemotron-H's blocks hold one mixer each: LoRA slots on the attention block's linears, the
    MLP blocks' up / down (not gated: one slice) and the MoE block's experts, in the latent width
    when there is one, with the two latent projections; none on the Mamba blocks nor the router."""
    lo = options._Lora(1, 8, 1, False, BF16)
    settings = Settings(max_model_len=4096, enable_lora=True, max_loras=1, max_lora_rank=8)
    spec = spec_from_config(NEMOTRON_H, "nh")
    h, inter, experts, e_inter = 256, 512, 4, 64
    attn = lo.column(h, [4 * 64, 2 * 64, 2 * 64]) + lo.row(4 * 64, h)
    mlp = lo.column(h, [inter]) + lo.row(inter, h)
    # No router adapter: LoRAModelManager skips the gate of a non-gated MoE.
    moe = lo.slots * lo.b * experts * ((8 * h + e_inter * 8) + (8 * e_inter + h * 8))
    layers = list(range(spec.num_layers))
    assert options.lora_bytes(spec, layers, False, False, 1, 1, settings, BF16) == pytest.approx(attn + 3 * mlp + moe)
    latent = spec_from_config(dict(NEMOTRON_H, moe_latent_size=64), "nh")
    k = 64
    moe_k = lo.slots * lo.b * experts * ((8 * k + e_inter * 8) + (8 * e_inter + k * 8))
    moe_k += lo.replicated(h, k) + lo.replicated(k, h)
    want = attn + 3 * mlp + moe_k
    assert options.lora_bytes(latent, layers, False, False, 1, 1, settings, BF16) == pytest.approx(want)
    (line,) = [a for a in estimate(latent, H100, settings).assumptions if a.startswith("LoRA")]
    assert "latent width" in line and "Mamba" in line


def test_qwen3_5_moe_lora_is_3d_only_in_its_conditional_generation_class() -> None:
    """Qwen3_5MoeForConditionalGeneration sets is_3d_moe_weight (FusedMoE3DWithLoRA: one w13 A
    per expert); Qwen3.5's text-only ForCausalLM keeps FusedMoEWithLoRA's two."""
    text = {
        "model_type": "qwen3_5_moe_text", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 32000, "max_position_embeddings": 32768,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_value_head_dim": 64, "num_experts": 16,
        "num_experts_per_tok": 2, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512,
        "torch_dtype": "bfloat16",
    }  # fmt: skip

    def lora(arch: str) -> float:
        spec = spec_from_config({"architectures": [arch], "model_type": "qwen3_5_moe", "text_config": text}, arch)
        assert spec.is_moe_layer(0)
        settings = Settings(enable_lora=True, max_loras=1, max_lora_rank=8)
        return options.lora_bytes(spec, [0], False, False, 1, 1, settings, BF16)

    # One w13 A (rank x hidden) less per expert, its B twice as wide is the same size.
    assert lora("Qwen3_5MoeForCausalLM") - lora("Qwen3_5MoeForConditionalGeneration") == 16 * 8 * 1024 * BF16


# The mamba cache mode per release (read in the PyPI sdists): whether prefix caching is on for a
# hybrid model by default (ModelConfig.is_prefix_caching_supported: off to 0.25.1, on from
# 0.26.0) and what it does to the mamba layers (MambaModelConfig.verify_and_update_config:
# 0.11 none; 0.14 "all" for SupportsMambaPrefixCaching models, disabled for the others; 0.16 to
# 0.27 "all" for those, "align" for the others; "align" from 0.28). Blocks per request and
# mamba group (MambaSpec.max_memory_usage_bytes): none 1, align 2, all cdiv(len, block).
NEMOTRON_H_ARCH = {**NEMOTRON_H, "architectures": ["NemotronHForCausalLM"]}


@pytest.mark.parametrize(
    ("config", "version", "prefix_caching", "per_group"),
    [
        pytest.param(QWEN3_NEXT, "0.19.0", None, "none", id="qwen3-next-0.19-default-off"),
        pytest.param(QWEN3_NEXT, "0.25.1", None, "none", id="qwen3-next-0.25-default-off"),
        pytest.param(QWEN3_NEXT, "0.26.0", None, "align", id="qwen3-next-0.26-default-on"),
        pytest.param(QWEN3_NEXT, "0.19.0", True, "align", id="qwen3-next-0.19-asked"),
        pytest.param(QWEN3_NEXT, "0.14.0", True, "none", id="qwen3-next-0.14-asked-disabled"),
        pytest.param(QWEN3_NEXT, "0.11.0", True, "none", id="qwen3-next-0.11-asked-off"),
        pytest.param(QWEN3_NEXT, "0.32.0", False, "none", id="qwen3-next-0.32-turned-off"),
        pytest.param(NEMOTRON_H_ARCH, "0.26.0", None, "all", id="nemotron-h-0.26-default-all"),
        pytest.param(NEMOTRON_H_ARCH, "0.27.0", None, "all", id="nemotron-h-0.27-default-all"),
        pytest.param(NEMOTRON_H_ARCH, "0.28.0", None, "align", id="nemotron-h-0.28-align"),
        pytest.param(NEMOTRON_H_ARCH, "0.19.0", None, "none", id="nemotron-h-0.19-default-off"),
        pytest.param(NEMOTRON_H_ARCH, "0.19.0", True, "all", id="nemotron-h-0.19-asked-all"),
        pytest.param(NEMOTRON_H_ARCH, "0.14.0", True, "all", id="nemotron-h-0.14-asked-all"),
    ],
)
def test_the_mamba_blocks_a_request_holds_follow_the_release(
    config: dict[str, Any], version: str, prefix_caching: bool | None, per_group: str
) -> None:
    mml = 32768
    _, est = run(config, max_model_len=mml, vllm_version=version, enable_prefix_caching=prefix_caching)
    block = est.block_size
    mamba_groups = 3  # both configs: 3 mamba groups next to their attention group(s)
    attention = cdiv(mml, block)  # one attention group in both
    each = {"none": 1, "align": 2, "all": cdiv(mml, block)}[per_group]
    assert est.num_gpu_blocks / est.max_concurrency == pytest.approx(attention + mamba_groups * each)
    assert f"mamba_cache_mode {per_group}" in " ".join(est.assumptions)


def test_issue_40691_blocks_per_request_on_0_19() -> None:
    """vLLM issue #40691 (0.19.0, Qwen3.5, 32,768-token requests): 33.04x from 1,487 blocks of
    784 tokens is 45 blocks a request, 42 of full attention and one per mamba group (3): the
    release held one state per request (prefix caching off for hybrids), not "align"'s two."""
    attention, groups = cdiv(32768, 784), 3
    assert attention == 42
    assert round(1487 / (attention + groups * 1), 2) == 33.04  # the log's figure
    assert round(1487 / (attention + groups * 2), 2) != 33.04  # "align" would print 30.98
