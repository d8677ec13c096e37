"""Bytes per layer as vLLM allocates them: each decoder layer's weights on one rank (attention,
MLP or routed experts, mixers, the DeepSeek indexer), a pipeline stage's parts (embedding,
head, layers), the checkpoint's file ratios, and one layer's KV bytes per token.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.accounting.base import CURRENT_VLLM, VOCAB_PAD, Accounting, MoeParallel, _ceil_div
from vllm_fleet.model.families import QWEN_GDN_TYPES
from vllm_fleet.model.quantspec import QuantSpec
from vllm_fleet.model.spec import ModelSpec

# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


@dataclass
class _Parts:
    embed: float = 0.0
    head: float = 0.0
    layer: float = 0.0
    vision: float = 0.0
    other: float = 0.0

    def total(self) -> float:
        return self.embed + self.head + self.layer + self.vision + self.other


def _linear(n_weights: float, quant: QuantSpec | None, dtype_b: float, expert: bool = False) -> float:
    if quant is None or (quant.experts_only and not expert):
        return n_weights * dtype_b
    return n_weights * quant.bytes_per_weight


def _attention_bytes(spec: ModelSpec, tp: int, quant: QuantSpec | None, db: float, acct: Accounting) -> float:
    h = spec.hidden_size
    heads_r = spec.num_attention_heads / tp
    if spec.is_mla:
        qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        total = 0.0
        if spec.q_lora_rank:
            total += _linear(h * spec.q_lora_rank, quant, db) + spec.q_lora_rank * db
            total += _linear(spec.q_lora_rank * heads_r * qk_head, quant, db)
        else:
            total += _linear(h * heads_r * qk_head, quant, db)
        total += _linear(h * (spec.kv_lora_rank + spec.qk_rope_head_dim), quant, db)
        total += spec.kv_lora_rank * db
        kv_b = spec.kv_lora_rank * heads_r * (spec.qk_nope_head_dim + spec.v_head_dim)
        total += _linear(kv_b, quant, db)
        # vLLM's MLA keeps absorbed W_UK / W_UV copies in the activation dtype.
        total += kv_b * db
        if acct.mla_absorbed_qo:
            # VLLM_MLA_PERFORM_MATRIX_ABSORPTION (0.7.x): W_Q_UK and W_UV_O,
            # re-quantized like the checkpoint.
            q_in = spec.q_lora_rank or h
            absorbed = q_in * heads_r * spec.kv_lora_rank + heads_r * spec.kv_lora_rank * h
            total += _linear(absorbed, quant, db)
        total += _linear(heads_r * spec.v_head_dim * h, quant, db)
        return total
    hd = spec.head_dim
    kv_r = max(1.0, spec.num_kv_heads / tp)
    q_out = heads_r * hd
    kv_out = 2 * kv_r * hd
    # Qwen3-Next's gated attention projects a gate next to every query head (attn_output_gate).
    gate = q_out if spec.model_type in QWEN_GDN_TYPES else 0.0
    total = _linear(h * (q_out + gate + kv_out), quant, db) + _linear(q_out * h, quant, db)
    if spec.attention_bias:
        total += (q_out + kv_out) * db
    if spec.model_type == "minimax_m2":
        # MiniMaxText01RMSNormTP over all heads' dims, sharded like the heads.
        total += (q_out + kv_r * hd) * db
    elif spec.qk_norm:
        total += 2 * hd * db
    if spec.model_type == "gpt_oss":
        total += heads_r * 4  # attention sinks, fp32
    return total


def _routed_expert_bytes(
    spec: ModelSpec, tp: int, ep: int, quant: QuantSpec | None, db: float, moe: MoeParallel | None = None
) -> float:
    """One MoE layer's routed-expert weights on the rank holding the most experts: whole
    experts under EP (``determine_expert_map``), else every expert TP-sharded over
    ``moe.moe_tp`` ranks (``tp`` when no layout is given)."""
    h = spec.moe_latent_size or spec.hidden_size  # Nemotron-H's latent MoE: experts in the latent width
    inter = spec.moe_intermediate_size
    if moe is not None:
        local: float = moe.local_experts
        shard = moe.moe_tp
    else:
        local = spec.num_experts / ep if ep > 1 else spec.num_experts
        shard = 1 if ep > 1 else tp
    if quant is not None and quant.method == "mxfp4":
        # vLLM's mxfp4 MoE backends on NVIDIA (Marlin, TRT-LLM) pad the hidden
        # size to 256 and each rank's intermediate size to 128
        # (mxfp4_round_up_hidden_size_and_intermediate_size).
        h = _ceil_div(h, 256) * 256
        inter = _ceil_div(_ceil_div(inter, shard), 128) * 128 * shard
    # Nemotron-H's experts are not gated (relu^2): up and down projections only.
    mats = 2 if spec.model_type == "nemotron_h" else 3
    total = _linear(local * mats * h * inter / shard, quant, db, expert=True)
    if spec.model_type == "gpt_oss":
        total += local * (3 * inter / shard) * db  # expert biases
    return total


def _part(quant: QuantSpec | None, index: int | None, part: str) -> QuantSpec | None:
    """The format of one part of a layer (ModelOpt's exclusions and per-module algorithms)."""
    return None if quant is None else quant.for_part(index, part)


def _mlp_bytes(
    spec: ModelSpec,
    index: int,
    tp: int,
    ep: int,
    quant: QuantSpec | None,
    db: float,
    moe: MoeParallel | None = None,
) -> float:
    h = spec.hidden_size
    # Nemotron-H's MLPs are not gated (relu^2): up and down projections only.
    mats = 2 if spec.model_type == "nemotron_h" else 3
    if not spec.is_moe_layer(index):
        return _linear(mats * h * spec.intermediate_size / tp, _part(quant, index, "mlp"), db)
    experts = spec.num_experts
    # Router, unquantized and replicated (logical experts only); MiniMax-M2's gate is fp32.
    router = h * experts * (4 if spec.model_type == "minimax_m2" else db)
    total = _routed_expert_bytes(spec, tp, ep, _part(quant, index, "experts"), db, moe)
    total += router
    if spec.model_type.startswith("deepseek") or spec.model_type == "nemotron_h" or spec.routing_bias:
        total += experts * 4  # e_score_correction_bias, fp32
    if spec.moe_latent_size:
        # fc1_latent_proj (hidden -> latent) and fc2_latent_proj (latent -> hidden): ReplicatedLinear.
        total += _linear(2 * h * spec.moe_latent_size, _part(quant, index, "latent"), db)
    if spec.num_shared_experts:
        total += _linear(mats * h * spec.shared_expert_intermediate_size / tp, _part(quant, index, "shared"), db)
        if spec.model_type.startswith("qwen2_moe") or spec.model_type in QWEN_GDN_TYPES:
            total += h * db  # shared expert gate
    return total


def _mixer_bytes(spec: ModelSpec, tp: int, quant: QuantSpec | None, db: float) -> float:
    """One mamba-type mixer on one rank, parameter by parameter as vLLM builds it."""
    h = spec.hidden_size
    if spec.linear_num_value_heads:
        # Qwen3-Next GatedDeltaNet (qwen_gdn_linear_attn.py): in_proj_qkvz, in_proj_ba,
        # conv1d (unquantized), dt_bias, A_log (fp32), RMSNormGated(head_v_dim), out_proj.
        k = spec.linear_key_head_dim * spec.linear_num_key_heads
        v = spec.linear_value_head_dim * spec.linear_num_value_heads
        heads = spec.linear_num_value_heads / tp
        total = _linear(h * (2 * k + 2 * v) / tp, quant, db) + _linear(h * 2 * heads, quant, db)
        total += (2 * k + v) / tp * spec.linear_conv_kernel_dim * db
        total += heads * db + heads * 4 + spec.linear_value_head_dim * db
        return total + _linear(v / tp * h, quant, db)
    inner, state, conv = spec.mamba_intermediate, spec.mamba_d_state, spec.mamba_d_conv
    if spec.mamba_version == 1:
        # MambaMixer (Jamba): no quant_config, so every projection is in the model dtype.
        rank = spec.mamba_dt_rank
        n = (
            h * 2 * inner  # in_proj
            + inner * (rank + 2 * state)  # x_proj
            + rank * inner
            + inner  # dt_proj + bias
            + inner * conv
            + (inner if spec.mamba_conv_bias else 0)  # conv1d
            + inner  # D
            + inner * h  # out_proj
        ) / tp
        return n * db + inner / tp * state * 4 + (rank + 2 * state) * db  # A (fp32), dt/B/C norms
    # MambaMixer2: groups are replicated to follow the head shards when TP does not divide them.
    groups = spec.mamba_n_groups + (0 if spec.mamba_n_groups % tp == 0 else tp - spec.mamba_n_groups)
    conv_dim = inner + 2 * groups * state
    heads = spec.mamba_n_heads
    proj_out = (inner + conv_dim + heads) / tp
    total = _linear(h * proj_out, quant, db) + _linear(inner / tp * h, quant, db)  # in_proj, out_proj
    if spec.mamba_proj_bias:
        total += (proj_out + h) * db
    total += conv_dim / tp * conv * db + (conv_dim / tp * db if spec.mamba_conv_bias else 0.0)  # conv1d
    total += heads / tp * 4 + 2 * heads / tp * db  # A (fp32), D, dt_bias
    if spec.model_type == "falcon_h1":
        # FalconH1SSMDecoderLayer's mup_vector buffer: one multiplier per in_proj output.
        total += (2 * inner + 2 * spec.mamba_n_groups * state + heads) / tp * db
    return total + (inner / tp * db if spec.mamba_rms_norm else 0.0)  # gated RMS norm


def _indexer_weight_bytes(spec: ModelSpec, quant: QuantSpec | None, db: float) -> float:
    """DeepSeek V3.2's Indexer (deepseek_v2.py), replicated on every rank: wq_b
    (quantized), the fused wk + weights_proj (unquantized) and k_norm (fp32 LayerNorm)."""
    if not spec.index_topk:
        return 0.0
    hd, heads = spec.index_head_dim, spec.index_n_heads
    wq_b = _linear(spec.q_lora_rank * heads * hd, quant, db)
    return wq_b + spec.hidden_size * (hd + heads) * db + 2 * hd * 4


def _gemma4_layer_bytes(
    spec: ModelSpec, index: int, tp: int, ep: int, quant: QuantSpec | None, db: float, moe: MoeParallel | None
) -> float:
    """One Gemma4DecoderLayer on one rank: attention at the layer's own head_dim and KV heads
    (a KV-shared layer has q_proj and o_proj only, and no k_norm), four norms, the MLP (double
    wide in the KV-shared tail with use_double_wide_mlp), the MoE block beside it (router with
    its scales, the experts, three more norms) and the per-layer-embedding gate, projection
    (replicated) and norm."""
    h = spec.hidden_size
    hd, kvh = spec.layer_head_dims[index], spec.layer_kv_heads[index]
    q_out = spec.num_attention_heads / tp * hd
    shared = 0 < spec.kv_shared_start <= index
    attn_q = _part(quant, index, "attn")
    total = _linear(h * q_out, attn_q, db)  # q_proj
    total += _linear(q_out * h, attn_q, db) + hd * db  # o_proj, q_norm
    if not shared:
        total += _linear(h * 2 * max(1.0, kvh / tp) * hd, attn_q, db) + hd * db  # k and v, k_norm
    inter = spec.intermediate_size * (2 if shared and spec.double_wide_mlp else 1)
    total += _linear(3 * h * inter / tp, _part(quant, index, "mlp"), db) + 4 * h * db
    if spec.num_experts:
        experts = spec.num_experts
        total += (h + experts) * db + h * experts * db + 3 * h * db  # router scale, per-expert scale, proj; norms
        total += _routed_expert_bytes(spec, tp, ep, _part(quant, index, "experts"), db, moe)
    if spec.per_layer_input_dim:
        total += _linear(2 * h * spec.per_layer_input_dim, quant, db) + h * db
    return total


def _gemma4_model_bytes(spec: ModelSpec, tp: int, quant: QuantSpec | None, db: float) -> float:
    """What Gemma4Model builds on every rank besides its layers (it has no first-rank check):
    the per-layer embedding table (vocab_size_per_layer_input x layers x width, vocabulary
    sharded like the embedding), the model projection to it (column parallel) and its norm."""
    width = spec.num_layers * spec.per_layer_input_dim
    if not width:
        return 0.0
    rows = _ceil_div(_ceil_div(spec.per_layer_input_vocab, VOCAB_PAD) * VOCAB_PAD, tp)
    return rows * width * db + _linear(spec.hidden_size * width / tp, quant, db) + spec.per_layer_input_dim * db


def _layer_bytes(
    spec: ModelSpec,
    index: int,
    tp: int,
    ep: int,
    quant: QuantSpec | None,
    db: float,
    acct: Accounting,
    moe: MoeParallel | None = None,
) -> float:
    if spec.layer_head_dims:
        return _gemma4_layer_bytes(spec, index, tp, ep, quant, db, moe)
    norms = 2 * spec.hidden_size * db
    if spec.model_type.startswith("gemma2") or spec.model_type.startswith("gemma3"):
        norms *= 2  # pre/post norms around attention and MLP
    if spec.model_type == "nemotron_h":
        norms /= 2  # one mixer (or MLP) and one norm per block
    total = norms
    if index not in spec.index_skip:
        total += _indexer_weight_bytes(spec, _part(quant, index, "indexer"), db)
    if spec.has_attention(index) or not spec.is_hybrid:
        total += _attention_bytes(spec, tp, _part(quant, index, "attn"), db, acct)
    if spec.has_mamba(index):
        total += _mixer_bytes(spec, tp, _part(quant, index, "mixer"), db)
    if spec.has_mlp(index):
        total += _mlp_bytes(spec, index, tp, ep, quant, db, moe)
    return total


def _vocab_rows(spec: ModelSpec, tp: int) -> int:
    padded = _ceil_div(spec.vocab_size, VOCAB_PAD) * VOCAB_PAD
    return _ceil_div(padded, tp)


def _stage_parts(
    spec: ModelSpec,
    layers: list[int],
    first: bool,
    last: bool,
    tp: int,
    ep: int,
    quant: QuantSpec | None,
    db: float,
    pp: int,
    acct: Accounting,
    moe: MoeParallel | None = None,
) -> _Parts:
    parts = _Parts()
    rows = _vocab_rows(spec, tp)
    gemma4 = bool(spec.layer_head_dims)
    if first or gemma4:  # Gemma4Model builds its embeddings on every PP rank
        parts.embed = rows * spec.hidden_size * db
        parts.vision = spec.vision_params * db / 1  # vision towers are replicated
    if last:
        parts.head = spec.hidden_size * db  # final norm
        if not spec.tie_word_embeddings or pp > 1:
            head_q = _part(quant, None, "head")
            parts.head += _linear(rows * spec.hidden_size, head_q, db)
    parts.layer = sum(_layer_bytes(spec, i, tp, ep, quant, db, acct, moe) for i in layers)
    # Rotary cos/sin cache: max_position x rotary_dim in the model dtype (one per layer kind
    # with its own RoPE, as get_rope caches them).
    if layers and spec.kind_rope_dims:
        kinds = {spec.layer_type(i) for i in layers}
        parts.other = spec.max_position_embeddings * sum(d for k, d in spec.kind_rope_dims if k in kinds) * db
    elif layers and spec.rotary:
        parts.other = spec.max_position_embeddings * (spec.rope_dim or spec.head_dim) * db
    if gemma4:
        parts.other += _gemma4_model_bytes(spec, tp, quant, db)
    return parts


def _file_ratios(spec: ModelSpec, quant: QuantSpec | None, db: float) -> dict[str, float]:
    """Scale factors from formula bytes to safetensors bytes, per model part."""
    acct = Accounting.for_version(CURRENT_VLLM)
    if not spec.file_bytes:
        return {}
    full = _stage_parts(spec, list(range(spec.num_layers)), True, True, 1, 1, quant, db, 1, acct)
    # The absorbed MLA copies are made at load time, not stored in the files.
    if spec.is_mla:
        heads = spec.num_attention_heads
        full.layer -= spec.num_layers * spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim) * db
    ratios: dict[str, float] = {}
    for part in ("embed", "head", "layer"):
        formula = getattr(full, part)
        found = spec.file_bytes.get(part, 0)
        if part == "head" and spec.tie_word_embeddings:
            continue
        if formula > 0 and found > 0:
            ratios[part] = found / formula
    # Absorbed MLA copies and runtime buffers are not in the files.
    return ratios


# --------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------


def _kv_layer_bytes(spec: ModelSpec, tp: int, kv_b: float, acct: Accounting) -> int:
    """Bytes one token takes in one layer's cache on one rank (DeepSeek V3.2: the MLA
    latent and the indexer's key cache, which vLLM keeps in one group)."""
    if spec.is_mla:
        size = int((spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_b)
        if spec.index_topk and kv_b == 1:
            # FLASHMLA_SPARSE serves every quantized dtype as fp8_ds_mla
            # (_canonicalize_sparse_mla_kv_cache_dtype): 656 bytes per token
            # (MLAAttentionSpec state_content_bytes).
            size = FP8_DS_MLA_BYTES
        if acct.mla_align_bytes:
            size = _ceil_div(size, acct.mla_align_bytes) * acct.mla_align_bytes
        return size + _indexer_bytes_per_token(spec)
    kv_r = max(1, spec.num_kv_heads // tp) if spec.num_kv_heads >= tp else 1
    return int(2 * kv_r * spec.head_dim * kv_b)


# DeepSeek V3.2's fp8_ds_mla row: 512 fp8 latent + 4 fp32 scales + 64 bf16 RoPE dims.
FP8_DS_MLA_BYTES = 656
# Indexer keys are fp8 with one fp32 scale per 128 elements (Indexer.quant_block_size).
INDEXER_QUANT_BLOCK = 128
# FlashAttention's kernel block sizes are MultipleOf(16) (get_supported_kernel_block_sizes):
# the alignment of a hybrid model's attention block; MLA backends need 128.
ATTN_KERNEL_ALIGN = 16
MLA_HYBRID_ALIGN = 128


def _indexer_bytes_per_token(spec: ModelSpec) -> int:
    """DeepseekV32IndexerCache: MLAAttentionSpec(num_kv_heads=1, uint8, head_size =
    index_head_dim + index_head_dim // 128 * 4), replicated on every TP rank."""
    if not spec.index_topk:
        return 0
    return spec.index_head_dim + spec.index_head_dim // INDEXER_QUANT_BLOCK * 4
