"""Memory of the ``vllm serve`` options users turn on: LoRA, speculative decoding, CPU
offload, fp8 KV scales and prefix caching, the way vLLM 0.32 allocates it.

Each function answers bytes on one rank; :func:`vllm_fleet.accounting.memory.estimate` adds them to
its columns and names them in ``RankMemory.parts`` with one ``Estimate.assumptions`` line.

* LoRA (``LoRAModelManager._create_lora_modules``): every ``LinearBase`` / ``MoERunner``
  module (``get_supported_lora_modules``), plus ``embed_tokens`` and ``lm_head`` where the
  model class declares ``embedding_modules``, is wrapped; each wrapper's
  ``create_lora_weights`` allocates ``max_loras`` zeroed A/B slots of ``max_lora_rank``
  in the LoRA dtype on the GPU, at load time (inside the weights the profiler measures).
* Speculative decoding (``SpeculativeConfig``, ``EagleProposer`` / ``DraftModelProposer``,
  only on the last PP rank: ``GPUModelRunner.__init__``): the draft's weights, its own
  attention layers (their KV specs join the target's pool) and its input buffers.
* CPU offload (``UVAOffloader._maybe_offload_to_cpu``): parameters of the decoder layers
  (``make_layers`` wraps them) move to pinned CPU memory, in order, until the per-GPU budget
  ``--cpu-offload-gb`` is reached.

Pure Python: nothing here imports torch or vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vllm_fleet.accounting.base import CURRENT_VLLM, Accounting
from vllm_fleet.accounting.parts import _kv_layer_bytes, _layer_bytes, _stage_parts, _vocab_rows
from vllm_fleet.errors import PlanError
from vllm_fleet.model.families import QWEN_GDN_TYPES
from vllm_fleet.model.quantspec import QuantSpec
from vllm_fleet.model.spec import DTYPE_BYTES, ModelSpec, load_model
from vllm_fleet.schema import LORA_DTYPES, LORA_RANKS

if TYPE_CHECKING:
    from vllm_fleet.accounting.settings import Settings

# LogitsProcessorWithLoRA.create_lora_weights refuses larger vocabularies.
LORA_MAX_VOCAB = 258048
# Model types whose vLLM class declares ``embedding_modules`` (embed_tokens / lm_head get
# LoRA slots too): llama.py, mistral.py, mixtral.py, qwen3.py, qwen3_moe.py, qwen3_5.py,
# granite*.py, commandr.py, exaone*.py, minicpm.py, nemotron*.py, jamba.py, phimoe.py,
# solar.py, falcon_h1.py, lfm2*.py, apertus.py. Qwen2, DeepSeek, Gemma, GPT-OSS and GLM
# declare none: only their linear layers get slots.
LORA_EMBEDDING_MODEL_TYPES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "granite", "granitemoe",
        "granitemoeshared", "granitemoehybrid", "cohere", "cohere2", "exaone", "exaone4", "exaone_moe", "minicpm",
        "nemotron", "nemotron_h", "jamba", "phimoe", "solar", "falcon_h1", "lfm2", "lfm2_moe", "apertus",
    }
)  # fmt: skip
# Model classes with ``is_3d_moe_weight`` (FusedMoE3DWithLoRA: one fused w13 slice).
LORA_3D_MOE_MODEL_TYPES = frozenset({"gpt_oss"})
# Model classes that set is_3d_moe_weight (qwen3_5.py, qwen3_vl_moe.py): FusedMoE3DWithLoRA for them too;
# Qwen3.5's text-only ForCausalLM is not one.
LORA_3D_MOE_ARCHITECTURES = frozenset({"Qwen3_5MoeForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"})

# SpeculativeConfig.method values the planner models, and the MTP model types vLLM
# rewrites to "mtp" (MTPModelTypes, deprecated as methods).
SPEC_METHODS = ("mtp", "eagle", "eagle3", "draft_model", "ngram", "ngram_gpu", "suffix")
MTP_ALIASES = frozenset(
    {
        "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "ernie_mtp", "qwen3_next_mtp",
        "qwen3_5_mtp", "longcat_flash_mtp", "pangu_ultra_moe_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    }
)  # fmt: skip
# Methods whose proposer runs on the CPU (or keeps only small GPU tables): no draft weights.
MODEL_FREE_METHODS = ("ngram", "ngram_gpu", "suffix")
SPEC_FIELD = "--speculative-config"
MAX_SPEC_TOKENS = 64


@dataclass(frozen=True)
class SpecDecode:
    """A ``--speculative-config`` as vLLM resolves it (``SpeculativeConfig.__post_init__``)."""

    method: str
    num_speculative_tokens: int
    # Attention layers the drafter adds to the KV pool (MTP: n_predict modules; EAGLE and
    # draft models: the draft's layers; n-gram and suffix: none).
    draft_layers: int
    draft: ModelSpec | None = None


def lora_dtype_bytes(settings: Settings, model_bytes: float) -> float:
    """LoRAConfig.verify_with_model_config: ``auto`` is the model dtype."""
    if settings.lora_dtype in (None, "auto"):
        return model_bytes
    return DTYPE_BYTES.get(settings.lora_dtype, 2)


def validate(settings: Settings) -> None:
    """The checks of LoRAConfig, SpeculativeConfig's JSON and the offload budget, one field
    named each (called from Settings.validate)."""
    for name, flag in (("enable_lora", "--enable-lora"), ("fully_sharded_loras", "--fully-sharded-loras")):
        if not isinstance(getattr(settings, name), bool):
            raise PlanError(flag, f"must be true or false, got {getattr(settings, name)!r}", "write true or false")
    _positive(settings.max_loras, "--max-loras", 1 << 12)
    if settings.max_lora_rank not in LORA_RANKS:
        raise PlanError(
            "--max-lora-rank",
            f"{settings.max_lora_rank!r} is not a rank vLLM accepts",
            f"use one of {', '.join(str(r) for r in LORA_RANKS)}",
        )
    if settings.max_cpu_loras is not None:
        _positive(settings.max_cpu_loras, "--max-cpu-loras", 1 << 16)
        if settings.max_cpu_loras < settings.max_loras:
            raise PlanError(
                "--max-cpu-loras",
                f"{settings.max_cpu_loras} is below --max-loras {settings.max_loras} (vLLM refuses it)",
                f"use {settings.max_loras} or more, or omit it",
            )
    if settings.lora_dtype not in LORA_DTYPES:
        raise PlanError("--lora-dtype", f"unknown LoRA dtype {settings.lora_dtype!r}", "use auto, float16 or bfloat16")
    offload = settings.cpu_offload_gb
    if isinstance(offload, bool) or not isinstance(offload, int | float) or not math.isfinite(offload) or offload < 0:
        raise PlanError("--cpu-offload-gb", f"must be a number of GiB, 0 or more, got {offload!r}", "e.g. 10, or 0")
    if offload > 1 << 20:
        raise PlanError("--cpu-offload-gb", f"{offload:g} is above {1 << 20:,}, the largest the planner accepts", "")
    if settings.enable_prefix_caching is not None and not isinstance(settings.enable_prefix_caching, bool):
        raise PlanError("--enable-prefix-caching", f"must be true or false, got {settings.enable_prefix_caching!r}", "")
    if settings.speculative_config is not None and not isinstance(settings.speculative_config, dict):
        raise PlanError(SPEC_FIELD, "must be a JSON object", '--speculative-config \'{"method": "mtp", ...}\'')


def _positive(value: Any, flag: str, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise PlanError(flag, f"must be an integer from 1 to {maximum:,}, got {value!r}", f"pass {flag} 1 or more")


def resolve_speculative(spec: ModelSpec, settings: Settings) -> SpecDecode | None:
    """``SpeculativeConfig.__post_init__`` for the methods the planner models: the method
    (None: ``ngram`` when the model is "ngram", else ``draft_model``; MTP model types are
    ``mtp``), ``num_speculative_tokens`` (MTP: ``n_predict`` by default, else a multiple of
    it) and the draft attention layers."""
    cfg = settings.speculative_config
    if cfg is None:
        return None
    method = cfg.get("method")
    model = cfg.get("model")
    if method is None:
        method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
    if not isinstance(method, str):
        raise PlanError(SPEC_FIELD, f"method must be a string, got {method!r}", f"use one of {', '.join(SPEC_METHODS)}")
    if method in MTP_ALIASES:
        method = "mtp"
    if method == "[ngram]":
        method = "ngram"
    if method not in SPEC_METHODS:
        raise PlanError(
            SPEC_FIELD,
            f"method {method!r} is not one the planner models",
            f"use one of {', '.join(SPEC_METHODS)}",
        )
    tokens = cfg.get("num_speculative_tokens")
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_SPEC_TOKENS
    ):
        raise PlanError(
            SPEC_FIELD, f"num_speculative_tokens must be an integer from 1 to {MAX_SPEC_TOKENS}, got {tokens!r}", ""
        )
    if method == "mtp":
        n_predict = spec.mtp_layers
        if not n_predict:
            raise PlanError(
                SPEC_FIELD,
                f"{spec.name} has no MTP modules (no num_nextn_predict_layers in its config)",
                "use eagle / eagle3 with a draft model, or ngram",
            )
        if tokens is None:
            tokens = n_predict
        elif tokens > n_predict and tokens % n_predict:
            raise PlanError(
                SPEC_FIELD,
                f"num_speculative_tokens {tokens} must be divisible by the model's n_predict={n_predict} (vLLM)",
                f"use {n_predict} or a multiple of it",
            )
        return SpecDecode("mtp", tokens, n_predict)
    if tokens is None:
        raise PlanError(
            SPEC_FIELD,
            "num_speculative_tokens is missing (vLLM needs it for this method)",
            'add "num_speculative_tokens": 3',
        )
    if method in MODEL_FREE_METHODS:
        return SpecDecode(method, tokens, 0)
    draft = settings.draft_spec
    if draft is None:
        raise PlanError(SPEC_FIELD, f"method {method} needs the draft model", 'add "model": "<draft folder or name>"')
    return SpecDecode(method, tokens, draft.num_layers, draft)


# --------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lora:
    slots: int  # max_loras
    rank: int
    tp: int
    full: bool  # fully_sharded_loras
    b: float  # bytes per element

    def column(self, inp: float, outs: list[float]) -> float:
        """ColumnParallelLinearWithLoRA / MergedColumn / MergedQKV (one A and B per slice):
        A (r or r/tp under fully sharded) x input, B output-per-partition x r."""
        a_rows = self.rank / self.tp if self.full else self.rank
        return self.slots * self.b * (len(outs) * a_rows * inp + sum(outs) * self.rank)

    def row(self, inp_per_rank: float, out: float) -> float:
        """RowParallelLinearWithLoRA: A r x input-per-partition, B output (/tp fully sharded) x r."""
        b_rows = out / self.tp if self.full else out
        return self.slots * self.b * (self.rank * inp_per_rank + b_rows * self.rank)

    def replicated(self, inp: float, out: float) -> float:
        """ReplicatedLinearWithLoRA: A r x input, B output x r."""
        return self.slots * self.b * (self.rank * inp + out * self.rank)


def lora_bytes(
    spec: ModelSpec, layers: list[int], first: bool, last: bool, tp: int, ep: int, settings: Settings, db: float
) -> float:
    """The LoRA A/B slots one rank allocates (``create_lora_weights`` of every wrapper)."""
    if not settings.enable_lora:
        return 0.0
    lo = _Lora(
        settings.max_loras, settings.max_lora_rank, tp, settings.fully_sharded_loras, lora_dtype_bytes(settings, db)
    )
    h = spec.hidden_size
    total = 0.0
    attn = _lora_attention(spec, lo, tp)
    for i in layers:
        # A hybrid's Mamba / linear-attention layers hold no attention, Nemotron-H's blocks one mixer each.
        total += (attn if spec.has_attention(i) else 0.0) + (_lora_mlp(spec, lo, i, tp, ep) if spec.has_mlp(i) else 0.0)
    if spec.model_type in LORA_EMBEDDING_MODEL_TYPES:
        v = spec.vocab_size
        if first:
            # VocabParallelEmbeddingWithLoRA: A (max_loras, org_vocab_size, r), B (max_loras, 1, hidden, r),
            # not sharded by TP.
            total += lo.slots * lo.b * (v * lo.rank + h * lo.rank)
        if last:
            # LogitsProcessorWithLoRA: A (max_loras, 1, r, hidden), B (max_loras, 1, vocab_size, r).
            total += lo.slots * lo.b * (lo.rank * h + v * lo.rank)
    return total


def _lora_attention(spec: ModelSpec, lo: _Lora, tp: int) -> float:
    h = spec.hidden_size
    heads_r = spec.num_attention_heads / tp
    if spec.is_mla:
        # DeepseekV2MLAAttention's linears: fused_qkv_a_proj (packed q_a_proj + kv_a_proj_with_mqa,
        # built with disable_tp: a rank-1 MergedColumnParallelLinearWithLoRA), q_b_proj / q_proj
        # and kv_b_proj (column), o_proj (row).
        qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        kv_a = spec.kv_lora_rank + spec.qk_rope_head_dim
        total = 0.0
        if spec.q_lora_rank:
            total += replace(lo, tp=1).column(h, [spec.q_lora_rank, kv_a])
            total += lo.column(spec.q_lora_rank, [heads_r * qk_head])
        else:
            total += lo.column(h, [heads_r * qk_head]) + lo.replicated(h, kv_a)
        total += lo.column(spec.kv_lora_rank, [heads_r * (spec.qk_nope_head_dim + spec.v_head_dim)])
        total += lo.row(heads_r * spec.v_head_dim, h)
        return total
    kv_r = max(1.0, spec.num_kv_heads / tp)
    q_out, kv_out = heads_r * spec.head_dim, kv_r * spec.head_dim
    # Qwen3-Next's gated attention packs a gate beside every query head (attn_output_gate): its
    # q slice is twice the heads' width.
    q_slice = 2 * q_out if spec.model_type in QWEN_GDN_TYPES else q_out
    # MergedQKVParallelLinearWithLoRA (q/k/v packed: three slices), RowParallel o_proj.
    return lo.column(h, [q_slice, kv_out, kv_out]) + lo.row(q_out, h)


def _lora_mlp(spec: ModelSpec, lo: _Lora, index: int, tp: int, ep: int) -> float:
    h = spec.hidden_size
    # Nemotron-H's MLPs and experts are not gated (NemotronHMLP: up_proj, down_proj; FusedMoEWithLoRA
    # keeps one w13 slice when the MoE is not is_act_and_mul).
    slices = 1 if spec.model_type == "nemotron_h" else 2
    if not spec.is_moe_layer(index):
        inter = spec.intermediate_size / tp
        return lo.column(h, [inter] * slices) + lo.row(inter, h)  # gate_up_proj (or up_proj), down_proj
    # A latent MoE's experts run in the latent width (FusedMoEWithLoRA.hidden_size is the MoE's hidden_dim).
    hm = spec.moe_latent_size or h
    experts_local = spec.num_experts / ep
    inter_p = spec.moe_intermediate_size / (1 if ep > 1 else tp)
    a_rows = lo.rank / tp if lo.full else lo.rank
    w2_b_rows = hm / tp if lo.full else hm
    if spec.model_type in LORA_3D_MOE_MODEL_TYPES or LORA_3D_MOE_ARCHITECTURES & set(spec.architectures):
        # FusedMoE3DWithLoRA: one w13 slice, its B of 2 x intermediate.
        per_expert = a_rows * hm + 2 * inter_p * lo.rank
    else:
        # FusedMoEWithLoRA: w1 and w3 slices (one, not gated), A rank x hidden, B intermediate x rank each.
        per_expert = slices * (a_rows * hm + inter_p * lo.rank)
    per_expert += lo.rank * inter_p + w2_b_rows * lo.rank  # w2 A and B
    total = lo.slots * lo.b * experts_local * per_expert
    if spec.model_type != "nemotron_h":
        # The router (ReplicatedLinear gate); LoRAModelManager skips it for a non-gated MoE (Nemotron-H).
        total += lo.replicated(h, spec.num_experts)
    if spec.moe_latent_size:
        total += lo.replicated(h, hm) + lo.replicated(hm, h)  # fc1_latent_proj, fc2_latent_proj
    if spec.num_shared_experts:
        shared = spec.shared_expert_intermediate_size / tp
        total += lo.column(h, [shared] * slices) + lo.row(shared, h)
    return total


def lora_graph_cases(settings: Settings) -> int:
    """CUDA graphs are captured once per LoRA case (``CudagraphDispatcher._get_lora_cases``
    with the default ``cudagraph_specialize_lora``: without LoRA and with max_loras + 1)."""
    return 2 if settings.enable_lora else 1


# --------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------


def draft_weight_bytes(
    spec: ModelSpec, sd: SpecDecode, tp: int, ep: int, db: float, tokens: int, quant: QuantSpec | None
) -> float:
    """The drafter's GPU bytes on the last PP rank: its layers, the projections feeding them,
    an own head where the method has one, and the proposer's input buffers
    (``SpecDecodeBaseProposer.__init__``: hidden_states and inputs_embeds of
    max_num_batched_tokens rows). ``quant``: the target's format as the plan resolved it (an MTP
    layer is quantized like the target's layers)."""

    if sd.method in MODEL_FREE_METHODS:
        return 0.0
    acct = Accounting.for_version(CURRENT_VLLM)
    h = spec.hidden_size
    if sd.method == "mtp":
        # DeepSeekMultiTokenPredictorLayer (and GLM-4.5 / Qwen3-Next MTP): enorm, hnorm, the
        # unquantized eh_proj (2h -> h), shared_head.norm and one decoder layer quantized like
        # the target; embed_tokens and shared_head.head are the target's (freed after load).
        n = sd.draft_layers
        layers = sum(_layer_bytes(spec, spec.num_layers + i, tp, ep, quant, db, acct) for i in range(n))
        return layers + n * (2 * h * h + 3 * h) * db + 2 * tokens * h * db
    draft = sd.draft
    assert draft is not None
    hd = draft.hidden_size
    quant = draft.quant  # the draft checkpoint's own format
    body = sum(_layer_bytes(draft, i, tp, 1, quant, db, acct) for i in range(draft.num_layers))
    buffers = tokens * (hd + h) * db
    if sd.method == "draft_model":
        # A whole model on the target's TP; nothing is shared with the target.
        parts = _stage_parts(draft, list(range(draft.num_layers)), True, True, tp, 1, quant, db, 1, acct)
        return parts.total() + buffers
    # EAGLE: fc over [embedding, hidden] (2h -> h), EAGLE-3: over three target layers'
    # hidden states (3h -> h) and an own lm_head of draft_vocab_size; embed_tokens (and
    # EAGLE's head) shared with the target when the checkpoint has none or an identical copy.
    fc_in = 3 * h if sd.method == "eagle3" else 2 * hd
    total = body + fc_in * hd * db + hd * db + buffers
    if sd.method == "eagle3":
        vocab = draft.draft_vocab_size or draft.vocab_size
        total += _vocab_rows(replace(draft, vocab_size=vocab), tp) * hd * db
    return total


def draft_kv_token_bytes(spec: ModelSpec, sd: SpecDecode, tp: int, kv_b: float) -> int:
    """Bytes one token takes in one draft attention layer (MTP: the target's own spec)."""

    acct = Accounting.for_version(CURRENT_VLLM)
    return _kv_layer_bytes(sd.draft if sd.draft is not None else spec, tp, kv_b, acct)


def decode_query_len(sd: SpecDecode | None) -> int:
    """``VllmConfig.uniform_decode_query_len``: 1 + num_speculative_tokens."""
    return 1 + (sd.num_speculative_tokens if sd else 0)


# --------------------------------------------------------------------------
# CPU offload
# --------------------------------------------------------------------------


def offloaded_bytes(settings: Settings, layer_bytes: float) -> float:
    """``UVAOffloader``: decoder-layer parameters move to CPU until ``cpu_offload_gb`` GiB
    (per GPU) are offloaded; the last parameter may overshoot the budget by its size, which
    the planner does not model (it offloads exactly the budget, or every layer parameter)."""
    if not settings.cpu_offload_gb:
        return 0.0
    return min(float(settings.cpu_offload_gb) * (1 << 30), layer_bytes)


# --------------------------------------------------------------------------
# What the estimate says it assumed
# --------------------------------------------------------------------------


def assumptions(spec: ModelSpec, settings: Settings, sd: SpecDecode | None) -> list[str]:
    """One line per option that changes (or, for prefix caching, does not change) memory."""
    lines: list[str] = []
    if settings.enable_lora:
        where = "every linear layer (attention, MLP" + (", experts and router" if spec.is_moe else "") + ")"
        if spec.model_type in LORA_EMBEDDING_MODEL_TYPES:
            where += ", embed_tokens and lm_head"
        if spec.moe_latent_size:
            where += ", the experts in the latent width and its two projections"
        if spec.is_hybrid:
            where += "; the Mamba / linear-attention mixers' linears not counted"
        lines.append(
            f"LoRA (weights.lora_gib): {settings.max_loras} adapter slot(s) x rank {settings.max_lora_rank} "
            f"({settings.lora_dtype}) on {where}, allocated at load "
            f"({'fully sharded' if settings.fully_sharded_loras else 'A replicated, B sharded'} under TP); "
            "CUDA graphs captured twice (with and without LoRA); the rank-sized fp32 buffers of the "
            f"profile pass's dummy LoRA are negligible; max_cpu_loras ({settings.max_cpu_loras or settings.max_loras})"
            " lives in CPU memory"
        )
    if sd is not None:
        if sd.method in MODEL_FREE_METHODS:
            what = f"{sd.method} proposes on the CPU: no draft weights or KV layers"
        elif sd.method == "mtp":
            what = (
                f"{sd.draft_layers} MTP module(s) of {spec.name} on the last PP rank (weights.draft_gib: "
                "decoder layer, eh_proj, norms; embed_tokens and lm_head shared with the target), "
                f"their attention layers join the KV pool (kv.draft_layers)"
            )
        else:
            assert sd.draft is not None
            what = (
                f"draft {sd.draft.name} ({sd.draft.num_layers} layers) on the last PP rank at the target's TP "
                f"(weights.draft_gib{'' if sd.method == 'draft_model' else '; embed_tokens shared with the target'}),"
                " its attention layers join the KV pool (kv.draft_layers)"
            )
        lines.append(
            f"speculative decoding ({sd.method}, {sd.num_speculative_tokens} tokens): {what}; CUDA graph sizes for "
            f"decode batches of {1 + sd.num_speculative_tokens} tokens per request"
        )
    if settings.cpu_offload_gb:
        lines.append(
            f"CPU offload (weights.cpu_offloaded_gib): up to {settings.cpu_offload_gb:g} GiB of decoder-layer "
            "parameters per GPU move to pinned CPU memory (UVA), not the embeddings or the head; the last "
            "parameter's overshoot is not modelled"
        )
    if settings.kv_cache_dtype.startswith("fp8"):
        lines.append(
            f"KV cache {settings.kv_cache_dtype}: one byte per element, no page rounding; the k/v/q/prob scales "
            "are four fp32 scalars per attention layer (negligible, not counted)"
        )
    if settings.kv_cache_memory_bytes is not None:
        lines.append(
            "kv_cache_memory_bytes: the KV pool is that size (vLLM still runs the profile pass but skips "
            "profiling-based sizing and ignores gpu_memory_utilization for it)"
        )
    if settings.enable_prefix_caching:
        lines.append(
            "prefix caching: no memory of its own (cached blocks are the KV pool's); hybrid / mamba models "
            "change their state caching with it (modelled with the KV layout, not here)"
        )
    return lines


def draft_spec_for(config: dict[str, Any] | None) -> ModelSpec | None:
    """The draft model a speculative config names (EAGLE / draft_model), loaded like --model."""

    if not config:
        return None
    model = config.get("model")
    method = config.get("method")
    if not isinstance(model, str) or method in MODEL_FREE_METHODS or model in ("ngram", "[ngram]"):
        return None
    if method == "mtp" or method in MTP_ALIASES:
        return None
    try:
        return load_model(model)
    except PlanError as err:
        raise PlanError(SPEC_FIELD, f"draft model: {err.problem}", err.fix) from None
