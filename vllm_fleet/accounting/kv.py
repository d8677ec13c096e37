"""The KV cache as vLLM lays it out: attention, sliding-window, chunked-local and mamba layers
grouped into one pool, the block and page sizes, and how many tokens the pool holds.

Pure Python, no torch or vLLM import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vllm_fleet.accounting.base import (
    Accounting,
    _ceil_div,
)
from vllm_fleet.accounting.parts import (
    ATTN_KERNEL_ALIGN,
    MLA_HYBRID_ALIGN,
    _indexer_bytes_per_token,
    _kv_layer_bytes,
)
from vllm_fleet.accounting.settings import Settings, env_flag
from vllm_fleet.model.spec import (
    DTYPE_BYTES,
    ModelSpec,
)


def _mamba_state(spec: ModelSpec, tp: int, db: float) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
    """(shapes, bytes per element) of one mamba-type layer's state on one rank, as vLLM's
    ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` give them (conv state
    in the "SD" layout; mamba_cache_dtype auto = the model dtype; the SSM state in
    mamba_ssm_cache_dtype, float32 for Nemotron-H by NemotronHForCausalLMConfig)."""
    ssm_b = DTYPE_BYTES.get(spec.mamba_ssm_cache_dtype, db) if spec.mamba_ssm_cache_dtype else db
    if spec.linear_num_value_heads:  # gated_delta_net_state_shape
        conv_dim = 2 * spec.linear_key_head_dim * spec.linear_num_key_heads
        conv_dim += spec.linear_value_head_dim * spec.linear_num_value_heads
        conv = (spec.linear_conv_kernel_dim - 1, conv_dim // tp)
        ssm: tuple[int, ...] = (spec.linear_num_value_heads // tp, spec.linear_value_head_dim, spec.linear_key_head_dim)
        return (conv, ssm), (db, ssm_b)
    if spec.mamba_version == 1:  # mamba1_state_shape
        inner = spec.mamba_intermediate // tp
        return ((spec.mamba_d_conv - 1, inner), (inner, spec.mamba_d_state)), (db, ssm_b)
    groups = spec.mamba_n_groups + (0 if spec.mamba_n_groups % tp == 0 else tp - spec.mamba_n_groups)
    conv_dim = spec.mamba_intermediate + 2 * groups * spec.mamba_d_state  # mamba2_state_shape
    conv = (spec.mamba_d_conv - 1, conv_dim // tp)
    ssm = (spec.mamba_n_heads // tp, spec.mamba_head_dim, spec.mamba_d_state)
    return (conv, ssm), (db, ssm_b)


def _mamba_state_bytes(spec: ModelSpec, tp: int, db: float) -> int:
    """MambaSpec.page_size_bytes before padding: one sequence's state in one layer."""
    shapes, sizes = _mamba_state(spec, tp, db)
    return int(sum(math.prod(shape) * size for shape, size in zip(shapes, sizes, strict=True)))


@dataclass(frozen=True)
class _KvGroup:
    """One KV cache group (KVCacheGroupSpec): layers sharing a block table."""

    kind: str  # "full", "sliding", "chunked" or "mamba"
    layers: tuple[int, ...]
    page_bytes: int  # one block of one layer (after the page sizes are unified)
    block: int  # tokens per block
    window: int = 0
    chunk: int = 0  # attention_chunk_size of a "chunked" group (ChunkedLocalAttentionSpec)


@dataclass(frozen=True)
class _KvLayout:
    """The whole model's KV cache groups (vLLM groups the merged specs of all ranks)."""

    groups: tuple[_KvGroup, ...]
    block: int  # the attention block size (hybrid mamba models: aligned to the mamba page)
    token_bytes: int  # attention bytes per token and layer
    mamba_state_bytes: int = 0  # per sequence and mamba layer, unpadded
    mamba_mode: str = "none"
    in_flight: int = 0  # vLLM's max_in_flight_tokens
    # Per-layer attention bytes per token where layers differ (Gemma 4's head dims); empty:
    # token_bytes for every attention layer.
    layer_token_bytes: tuple[tuple[int, int], ...] = ()

    def token_bytes_of(self, layers: list[int]) -> int:
        """Attention bytes one token takes in ``layers`` (the rank's layers)."""
        if not self.layer_token_bytes:
            return self.token_bytes * self.attention_layers(layers)
        here = set(layers)
        return sum(b for i, b in self.layer_token_bytes if i in here)

    def bytes_per_block(self, layers: list[int]) -> int:
        """``_get_kv_cache_bytes_per_block`` on one rank: the largest group's pages (one group
        whose layers have pages of their own: their sum)."""
        here = set(layers)
        if self.layer_token_bytes and len(self.groups) == 1:
            return self.groups[0].block * self.token_bytes_of(layers)
        return max((sum(g.page_bytes for i in g.layers if i in here) for g in self.groups), default=0)

    def blocks_per_request(self, length: int, acct: Accounting) -> int:
        """``get_max_concurrency_for_kv_cache_config``: the sum over groups of
        cdiv(max_memory_usage_bytes, page_size_bytes) for a request of ``length`` tokens."""
        return sum(self.group_blocks(g, length) for g in self.groups)

    def group_blocks(self, g: _KvGroup, length: int) -> int:
        """One group's blocks for a request of ``length`` tokens (its spec's
        ``max_memory_usage_bytes`` / page)."""
        if g.kind == "mamba":
            # MambaSpec.max_memory_usage_bytes: a block per block of the request in "all" mode,
            # 2 in "align" mode, else 1.
            if self.mamba_mode == "all":
                return _ceil_div(length, g.block)
            return 2 if self.mamba_mode == "align" else 1
        if g.kind == "sliding" and g.window:
            # SlidingWindowSpec.max_admission_blocks_per_request.
            return _ceil_div(min(g.window - 1 + self.in_flight, length), g.block) + 1
        if g.kind == "chunked" and g.chunk:
            # ChunkedLocalAttentionSpec.max_admission_blocks_per_request: one chunk plus the
            # in-flight tokens (max_in_flight_tokens, as for sliding windows), never more than
            # the request; no +1 (unlike a window, a chunk starts on a block boundary).
            return _ceil_div(min(g.chunk + self.in_flight, length), g.block)
        return _ceil_div(length, g.block)

    def attention_layers(self, layers: list[int]) -> int:
        here = set(layers)
        return sum(1 for g in self.groups if g.kind != "mamba" for i in g.layers if i in here)


def _attention_block(spec: ModelSpec, token_bytes: int, mamba_page: int, block: int) -> int:
    """``Platform._align_hybrid_block_size``: the smallest attention block (a multiple of
    the kernel block, at least ``block``) whose page holds one mamba state."""
    align = max(ATTN_KERNEL_ALIGN, block)
    if spec.is_mla:
        align = max(align, MLA_HYBRID_ALIGN)
    size = align * _ceil_div(mamba_page, align * token_bytes)
    size = ATTN_KERNEL_ALIGN * _ceil_div(size, ATTN_KERNEL_ALIGN)
    return max(block, size)


def _group_layers(
    buckets: dict[tuple[str, int], list[int]], ratio: float = 1.5
) -> list[tuple[str, int, tuple[int, ...]]]:
    """``_get_kv_cache_groups_uniform_page_size``: split each bucket of same-spec layers
    into groups of the same size (the smallest bucket; the largest when it is below ``ratio``
    times the smallest: Accounting.group_max_ratio, by release), layers[i::n] to the i-th of a
    bucket's n groups."""
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * ratio:
        group_size = max(sizes)
    out: list[tuple[str, int, tuple[int, ...]]] = []
    for (kind, size), layers in buckets.items():
        n = _ceil_div(len(layers), group_size)
        out += [(kind, size, tuple(layers[i::n])) for i in range(n)]
    return out


# The architectures whose vLLM class is SupportsMambaPrefixCaching (0.26.0's models: falcon_h1,
# granitemoehybrid, jamba, mamba, mamba2, nemotron_h, zamba2): where prefix caching keeps a
# mamba state per block ("all" mode) in the releases that offer it.
MAMBA_PREFIX_CACHING_ARCHS = frozenset(
    {"FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "JambaForCausalLM", "MambaForCausalLM",
     "Mamba2ForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM"}
)  # fmt: skip


def mamba_cache_mode(spec: ModelSpec, settings: Settings, acct: Accounting) -> str:
    """``cache_config.mamba_cache_mode`` once vLLM has set it for a model with mamba layers:
    "none" (one state per request), "align" (2) or "all" (one per block). Prefix caching is the
    operator's --enable-prefix-caching, else the release's default for hybrid models."""
    enabled = settings.enable_prefix_caching
    if enabled is None:
        enabled = acct.hybrid_prefix_caching
    if not enabled or acct.mamba_prefix_caching == "off":
        return "none"
    supports = bool(set(spec.architectures) & MAMBA_PREFIX_CACHING_ARCHS)
    if acct.mamba_prefix_caching == "all":
        return "all" if supports else "none"
    if acct.mamba_prefix_caching == "all-or-align":
        return "all" if supports else "align"
    return "align"


CHUNKED_HYBRID_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"


def chunked_local_attn_hybrid_kv(env: Mapping[str, str]) -> bool:
    """VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE as vllm/envs.py reads it ("1" by default)."""
    return env_flag(env, CHUNKED_HYBRID_ENV) is not False


def _chunked_as_full(spec: ModelSpec, settings: Settings) -> bool:
    """Whether vLLM allocates Llama 4's chunked layers as full attention: the hybrid KV cache
    manager is off (VllmConfig.__post_init__ turns it off for chunked local attention when
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0; CUDA, ROCm and CPU all support it
    otherwise) and the model also has full layers: ``unify_hybrid_kv_cache_specs`` /
    ``_promote_local_kv_cache_specs`` then make every ChunkedLocalAttentionSpec a
    FullAttentionSpec (a model of chunked layers only is uniform and keeps its spec)."""
    types = {spec.layer_type(i) for i in range(spec.num_layers)}
    return not settings.chunked_local_attn_hybrid_kv and {"chunked", "full"} <= types


def _kv_kind(spec: ModelSpec, index: int, chunked_as_full: bool) -> str:
    """The KV cache spec an attention layer asks for: "sliding" (SlidingWindowSpec),
    "chunked" (ChunkedLocalAttentionSpec, unless ``unify_hybrid_kv_cache_specs`` promotes
    it to full attention) or "full"."""
    kind = spec.layer_type(index)
    if kind == "sliding" and spec.sliding_window:
        return "sliding"
    if kind == "chunked" and spec.attention_chunk_size and not chunked_as_full:
        return "chunked"
    return "full"


def _kv_layout(
    spec: ModelSpec,
    tp: int,
    kv_b: float,
    block: int,
    acct: Accounting,
    db: float,
    settings: Settings,
    tokens: int,
    mml: int,
    device_kind: str,
    draft_layers: int = 0,
) -> _KvLayout:
    """The KV cache groups of the whole model (``get_kv_cache_groups``): one group when
    every layer has the same spec; otherwise one bucket per spec (full attention,
    each sliding window, each chunk size of chunked local attention, mamba) split into
    equal groups; with ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0`` chunked
    layers next to full ones join the full bucket. ``draft_layers``: full-attention
    layers of a speculative drafter with the target's page size (MTP modules), numbered
    after the target's layers; they join the last stage's pool (the runner's
    ``get_kv_cache_spec`` lists them with the target's)."""
    if spec.layer_head_dims and acct.engine == "v1":
        in_flight = tokens * _in_flight_batches(acct, settings.pipeline_parallel_size, device_kind)
        return _per_layer_layout(spec, tp, kv_b, block, in_flight)
    token_bytes = _kv_layer_bytes(spec, tp, kv_b, acct)
    all_layers = list(range(spec.num_layers))
    if spec.index_skip and acct.engine == "v1":
        # IndexCache: the layers without an indexer hold the MLA latent only. Every spec is an
        # MLAAttentionSpec, so vLLM keeps one group whose layers have pages of their own
        # (UniformTypeKVCacheSpecs).
        skip = _indexer_bytes_per_token(spec)
        per_layer = tuple((i, token_bytes - (skip if i in spec.index_skip else 0)) for i in all_layers)
        in_flight = tokens * _in_flight_batches(acct, settings.pipeline_parallel_size, device_kind)
        group = _KvGroup("full", tuple(all_layers), token_bytes * block, block)
        return _KvLayout((group,), block, token_bytes, in_flight=in_flight, layer_token_bytes=per_layer)
    drafts = list(range(spec.num_layers, spec.num_layers + draft_layers))
    in_flight = tokens * _in_flight_batches(acct, settings.pipeline_parallel_size, device_kind)
    mamba_layers = [i for i in all_layers if spec.has_mamba(i)] if acct.engine == "v1" else []
    attn_layers = [i for i in all_layers if spec.has_attention(i) or not spec.is_hybrid]
    state = _mamba_state_bytes(spec, tp, db) if mamba_layers else 0
    mode = mamba_cache_mode(spec, settings, acct) if mamba_layers else "none"
    if mamba_layers and attn_layers:
        block = _attention_block(spec, token_bytes, state, block)
    page = token_bytes * block
    if mamba_layers and not attn_layers:
        page = state
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0: chunked layers promoted to full.
    as_full = _chunked_as_full(spec, settings)
    # The window (sliding) or chunk (chunked) a bucket's spec carries; 0 for the others.
    sizes = {"sliding": spec.sliding_window, "chunked": spec.attention_chunk_size}
    if acct.engine == "v0" or not mamba_layers:
        kinds = {_kv_kind(spec, i, as_full) for i in attn_layers} | ({"full"} if drafts else set())
        if acct.engine == "v0" or len(kinds) == 1:
            # One group: every layer keeps the whole sequence (V0 ignored windows and chunks
            # when sizing; a uniform model has one group anyway).
            only = "full" if acct.engine == "v0" else next(iter(kinds))
            size = sizes.get(only, 0)
            window, chunk = (size, 0) if only == "sliding" else (0, size)
            group = _KvGroup(only, tuple(attn_layers + drafts), page, block, window, chunk)
            return _KvLayout((group,), block, token_bytes, in_flight=in_flight)
    # get_kv_cache_groups: one bucket per spec (full, each sliding window, each chunk size,
    # mamba), in the order the layers first ask for it.
    buckets: dict[tuple[str, int], list[int]] = {}
    for i in all_layers:
        if spec.has_attention(i) or not spec.is_hybrid:
            kind = _kv_kind(spec, i, as_full)
            buckets.setdefault((kind, sizes.get(kind, 0)), []).append(i)
    if drafts:
        buckets.setdefault(("full", 0), []).extend(drafts)
    for i in mamba_layers:
        buckets.setdefault(("mamba", 0), []).append(i)
    mamba_block = mml if mode == "none" else block
    groups = tuple(
        _KvGroup(
            kind,
            layers,
            page,
            mamba_block if kind == "mamba" else block,
            window=size if kind == "sliding" else 0,
            chunk=size if kind == "chunked" else 0,
        )
        for kind, size, layers in _group_layers(buckets, acct.group_max_ratio)
    )
    return _KvLayout(groups, block, token_bytes, state, mode, in_flight)


def _per_layer_layout(spec: ModelSpec, tp: int, kv_b: float, block: int, in_flight: int) -> _KvLayout:
    """Gemma 4: layers whose KV heads and head_dim differ by kind, and a KV-shared tail that
    registers no cache (``get_kv_cache_spec`` skips a layer with a kv_sharing_target). One
    bucket per spec; ``unify_kv_cache_spec_page_size`` gives every group the largest page: a
    smaller page that divides it takes a larger block, another is padded to it."""
    cached = [i for i in range(spec.num_layers) if not 0 < spec.kv_shared_start <= i]
    tok = {i: int(2 * max(1, spec.layer_kv_heads[i] // tp) * spec.layer_head_dims[i] * kv_b) for i in cached}
    sizes = {"sliding": spec.sliding_window}
    buckets: dict[tuple[str, int], list[int]] = {}
    for i in cached:
        kind = "sliding" if spec.layer_type(i) == "sliding" and spec.sliding_window else "full"
        buckets.setdefault((kind, sizes.get(kind, 0)), []).append(i)
    pages = {key: max(tok[i] for i in layers) * block for key, layers in buckets.items()}
    top = max(pages.values())
    shape = {key: (top, block * top // page if top % page == 0 else block) for key, page in pages.items()}
    per_layer = tuple(sorted(tok.items()))
    if len(buckets) == 1:
        (kind, size), layers = next(iter(buckets.items()))
        group = _KvGroup(kind, tuple(layers), top, block, window=size if kind == "sliding" else 0)
        return _KvLayout((group,), block, max(tok.values()), in_flight=in_flight, layer_token_bytes=per_layer)
    groups = tuple(
        _KvGroup(kind, layers, shape[(kind, size)][0], shape[(kind, size)][1], window=size if kind == "sliding" else 0)
        for kind, size, layers in _group_layers(buckets)
    )
    return _KvLayout(groups, block, max(tok.values()), in_flight=in_flight, layer_token_bytes=per_layer)


def _kv_parts(
    spec: ModelSpec, layout: _KvLayout, tp: int, acct: Accounting, mml: int
) -> tuple[Callable[[list[int]], dict[str, float]], list[str]]:
    """The KV parts of a rank (``kv.*_bytes``) and one assumptions line each, for the
    models whose cache is more than one group of full attention."""
    lines: list[str] = []
    kinds = [g.kind for g in layout.groups]
    hybrid = len(layout.groups) > 1
    if hybrid:
        shown = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
        lines.append(
            f"KV groups: {len(layout.groups)} ({shown}) of up to {max(len(g.layers) for g in layout.groups)} layers, "
            "sharing one block pool (get_kv_cache_groups); a request holds blocks in every group"
        )
    if any(g.kind == "sliding" for g in layout.groups):
        lines.append(
            f"sliding window {spec.sliding_window}: a request keeps window - 1 + {layout.in_flight:,} in-flight tokens "
            "(+1 block) per sliding group (SlidingWindowSpec.max_admission_blocks_per_request)"
        )
    if layout.mamba_state_bytes:
        lines.append(
            f"mamba state: {layout.mamba_state_bytes:,} bytes per sequence and layer on each rank (TP={tp}), padded "
            f"to the attention page; attention block {layout.block} tokens (Platform._align_hybrid_block_size); "
            f"mamba_cache_mode {layout.mamba_mode}: "
            + (
                "a block per block of the request"
                if layout.mamba_mode == "all"
                else f"{2 if layout.mamba_mode == 'align' else 1} block(s) per request"
            )
            + " per mamba group (the release's prefix-caching default for hybrid models unless set)"
        )
    if layout.mamba_state_bytes:
        lines.append(
            "mamba-type mixers: weights parameter by parameter (MambaMixer / MambaMixer2 / GatedDeltaNet); their "
            "activation peak approximated by the in_proj and gated outputs of one forward pass"
        )
    if spec.index_topk:
        lines.append(
            f"DeepSeek V3.2 indexer: {_indexer_bytes_per_token(spec)} bytes per token and layer (fp8 keys + fp32 "
            "scales, DeepseekV32IndexerCache) in the MLA group, on every rank; its weights replicated and the "
            "int32 top-k index buffer (max_num_batched_tokens x index_topk) counted with the weights"
        )

    def parts(layers: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        if hybrid:
            out["kv.groups"] = len(layout.groups)
            out["kv.page_bytes"] = layout.groups[0].page_bytes
        if layout.mamba_state_bytes:
            mamba = sum(1 for g in layout.groups if g.kind == "mamba" for i in g.layers if i in set(layers))
            out["kv.ssm_state_bytes_per_seq"] = layout.mamba_state_bytes * mamba
            out["kv.attention_block_size"] = layout.block
        if spec.index_topk:
            built = sum(1 for i in layers if i not in spec.index_skip)
            out["kv.indexer_bytes_per_token"] = _indexer_bytes_per_token(spec) * built
        chunked = [g for g in layout.groups if g.kind == "chunked"]
        if chunked:
            # What one request of max_model_len holds in the rank's chunked groups: each
            # group's blocks x its layers on the rank x one page.
            here = set(layers)
            out["kv.chunked_bytes_per_request"] = float(
                sum(layout.group_blocks(g, mml) * sum(1 for i in g.layers if i in here) * g.page_bytes for g in chunked)
            )
        return out

    return parts, lines


def _in_flight_batches(acct: Accounting, pp: int, device_kind: str) -> int:
    """``VllmConfig.max_concurrent_batches`` (max_in_flight_tokens = it x
    max_num_batched_tokens): async scheduling is on by default and Model Runner V2 keeps
    pp + 1 batches in flight; the CPU build runs the V1 runner (2 batches, none beyond PP
    with PP, where async scheduling is off). Releases before the current accounting
    reserved one batch (the planner's rule for them)."""
    if not acct.in_flight_batches:
        return 1
    if device_kind == "cpu":
        return 2 if pp == 1 else pp
    return pp + 1


def _reported_tokens(layout: _KvLayout, num_blocks: int, conc: float, mml: int, acct: Accounting) -> int:
    """The "GPU KV cache size: N tokens" line: int(max_concurrency x max_model_len)
    (``get_kv_cache_capacity``); releases before 0.21 printed num_blocks // groups x the
    smallest block size (``_report_kv_cache_config``), which is what hybrid logs of those
    releases show. V0 printed num_blocks x block_size."""
    if acct.engine == "v0":
        return num_blocks * layout.block
    if not acct.tokens_from_concurrency:
        return num_blocks // max(len(layout.groups), 1) * min(g.block for g in layout.groups)
    return int(conc * mml)


def _max_len_fit(layout: _KvLayout, blocks: int, cap: int, acct: Accounting) -> int:
    """``_estimate_max_model_len_from_groups``: the largest length whose blocks fit, the
    null block held back (0.32: the check plans against available - one block)."""
    usable = blocks - (1 if acct.null_block_reserved else 0)
    lo, hi = 0, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if layout.blocks_per_request(mid, acct) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


def llama4_assumptions(spec: ModelSpec, layout: _KvLayout, settings: Settings) -> list[str]:
    """One line each for Llama 4's MoE layout and its chunked local attention."""
    lines: list[str] = []
    if spec.model_type.startswith("llama4") and spec.is_moe:
        moe = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
        lines.append(
            f"Llama 4 MoE (Llama4DecoderLayer): {moe} of {spec.num_layers} layers MoE "
            f"(interleave_moe_layer_step {spec.moe_layer_step}), {spec.num_experts} experts of "
            f"{spec.moe_intermediate_size} + 1 shared expert, top-{spec.num_experts_per_tok}; "
            f"dense layers intermediate_size_mlp {spec.intermediate_size}"
        )
    chunked = sum(spec.layer_type(i) == "chunked" for i in range(spec.num_layers))
    if chunked:
        if any(g.kind == "chunked" for g in layout.groups):
            how = (
                f"hold at most attention_chunk_size + {layout.in_flight:,} in-flight tokens per request and "
                "chunked group (ChunkedLocalAttentionSpec.max_admission_blocks_per_request, hybrid KV cache manager)"
            )
        elif _chunked_as_full(spec, settings):
            how = (
                f"are allocated as full attention (hybrid KV cache manager off: {CHUNKED_HYBRID_ENV}=0, "
                "unify_hybrid_kv_cache_specs)"
            )
        else:
            how = "are allocated as full attention (one KV cache group)"
        lines.append(
            f"chunked local attention: {chunked} of {spec.num_layers} layers (the RoPE layers) attend within "
            f"{spec.attention_chunk_size}-token chunks and {how}; CUDA graphs piecewise only "
            "(the chunked backend supports no full graph)"
        )
    return lines
