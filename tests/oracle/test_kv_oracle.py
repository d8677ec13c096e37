"""The planner's KV cache of hybrid models against vLLM's own code.

For each family a shrunk config (the keys of the real config.json, tiny sizes) goes to both
sides. vLLM's side, without a model or a GPU: the layer kinds from the Hugging Face config
class and vLLM's decoder-layer tables, the mamba state from the model class's
``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config``, the cache
mode from ``MambaModelConfig.verify_and_update_config``, the attention block from
``Platform._align_hybrid_block_size`` (FlashAttention's kernel block sizes), the
DeepSeek V3.2 indexer spec from ``DeepseekV32IndexerCache.get_kv_cache_spec``; then
``get_kv_cache_configs`` for a given available memory, ``get_kv_cache_capacity`` (the
"GPU KV cache size" / "Maximum concurrency" line) and ``_estimate_max_model_len_from_groups``.
All cases run in one oracle call.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.oracle.conftest import OracleRun
from vllm_fleet.accounting.memory import Estimate, estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.spec import spec_from_config

H100 = Device("H100-SXM", 79.19, "cuda", 9)
MBT = 2048
LEN = 32768

_ATTN = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": LEN,
    "torch_dtype": "bfloat16",
}
CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (transformers config class, vLLM model module:class, config.json)
    "gpt_oss": (
        "GptOssConfig",
        "",
        dict(
            _ATTN,
            model_type="gpt_oss",
            num_hidden_layers=6,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"] * 3,
            num_local_experts=4,
            experts_per_token=2,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "",
        dict(_ATTN, model_type="gemma3_text", num_hidden_layers=12, sliding_window=1024, sliding_window_pattern=6),
    ),
    "gpt_oss_13_12": (
        "GptOssConfig",
        "",
        dict(
            _ATTN,
            model_type="gpt_oss",
            num_hidden_layers=25,
            sliding_window=128,
            layer_types=["full_attention"] * 13 + ["sliding_attention"] * 12,
            num_local_experts=4,
            experts_per_token=2,
        ),
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "qwen3_next:Qwen3NextForCausalLM",
        dict(
            _ATTN,
            model_type="qwen3_next",
            num_hidden_layers=8,
            full_attention_interval=4,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=32,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_value_head_dim=32,
        ),
    ),
    # Qwen3.5: Qwen3-Next's layers, its layer_types, and a float32 SSM state from mamba_ssm_dtype
    # (Qwen3_5ForConditionalGenerationConfig.verify_and_update_config).
    "qwen3_5": (
        "Qwen3_5TextConfig",
        "qwen3_5:Qwen3_5ForCausalLM",
        dict(
            _ATTN,
            model_type="qwen3_5_text",
            num_hidden_layers=8,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=32,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_value_head_dim=32,
            mamba_ssm_dtype="float32",
        ),
    ),
    "granite_h": (
        "GraniteMoeHybridConfig",
        "granitemoehybrid:GraniteMoeHybridForCausalLM",
        dict(
            _ATTN,
            model_type="granitemoehybrid",
            num_hidden_layers=4,
            layer_types=["mamba", "mamba", "mamba", "attention"],
            shared_intermediate_size=512,
            num_local_experts=0,
            mamba_n_heads=8,
            mamba_d_head=64,
            mamba_n_groups=1,
            mamba_d_state=32,
            mamba_d_conv=4,
            mamba_expand=2,
        ),
    ),
    "nemotron_h": (
        "NemotronHConfig",
        "nemotron_h:NemotronHForCausalLM",
        dict(
            _ATTN,
            model_type="nemotron_h",
            num_hidden_layers=8,
            hybrid_override_pattern="M-M*-M-M",
            mamba_num_heads=8,
            mamba_head_dim=32,
            n_groups=2,
            ssm_state_size=16,
            conv_kernel=4,
        ),
    ),
    "jamba": (
        "JambaConfig",
        "jamba:JambaForCausalLM",
        dict(
            _ATTN,
            model_type="jamba",
            num_hidden_layers=8,
            num_experts=4,
            num_experts_per_tok=2,
            attn_layer_period=8,
            attn_layer_offset=4,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
        ),
    ),
    "falcon_h1": (
        "FalconH1Config",
        "falcon_h1:FalconH1ForCausalLM",
        dict(
            _ATTN,
            model_type="falcon_h1",
            num_hidden_layers=4,
            mamba_d_ssm=512,
            mamba_n_heads=8,
            mamba_d_head=64,
            mamba_n_groups=1,
            mamba_d_state=16,
            mamba_d_conv=4,
        ),
    ),
    "deepseek_v32": (
        "DeepseekV32Config",
        "",
        dict(
            _ATTN,
            model_type="deepseek_v32",
            num_hidden_layers=4,
            num_key_value_heads=4,
            moe_intermediate_size=128,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=512,
            q_lora_rank=256,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            index_topk=256,
            index_n_heads=16,
            index_head_dim=128,
        ),
    ),
    # Gemma 4: full layers at their own head_dim (a page twice the sliding one: unified by a
    # larger sliding block), a KV-shared tail without a cache of its own.
    "gemma4": (
        "Gemma4TextConfig",
        "",
        dict(
            _ATTN,
            model_type="gemma4_text",
            num_hidden_layers=12,
            sliding_window=1024,
            global_head_dim=128,
            num_kv_shared_layers=4,
            hidden_size_per_layer_input=0,
        ),
    ),
    # attention_k_eq_v with one global KV head: the pages are equal.
    "gemma4_keqv": (
        "Gemma4TextConfig",
        "",
        dict(
            _ATTN,
            model_type="gemma4_text",
            num_hidden_layers=12,
            sliding_window=1024,
            global_head_dim=128,
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            hidden_size_per_layer_input=0,
        ),
    ),
    # A full page that the sliding page does not divide (head_dim 96): padded to it.
    "gemma4_pad": (
        "Gemma4TextConfig",
        "",
        dict(
            _ATTN,
            model_type="gemma4_text",
            num_hidden_layers=12,
            sliding_window=1024,
            global_head_dim=96,
            hidden_size_per_layer_input=0,
        ),
    ),
}
# GLM-5-style IndexCache (index_topk_freq 2): every other layer from the third builds no
# indexer, and holds the MLA latent only.
CONFIGS["deepseek_v32_ic"] = (
    "DeepseekV32Config",
    "",
    dict(CONFIGS["deepseek_v32"][2], num_hidden_layers=8, index_topk_freq=2),
)
# (config, TP, KV pool bytes, kv cache dtype, prefix caching): pools that hold a request at
# LEN and pools too small for it (the fit is then vLLM's estimate).
CASES = [
    (name, tp, mem, kv_dtype, prefix)
    for name in CONFIGS
    for tp, kv_dtype, prefix in (
        [(1, "auto", True), (2, "auto", True), (1, "auto", False)]
        + ([(1, "fp8", True)] if name.startswith("deepseek_v32") else [])
    )
    if not (name.startswith("deepseek_v32") and not prefix)
    for mem in (1 << 30, 40 << 20, 8 << 20)
]

ORACLE = """
import importlib
import importlib.abc
import importlib.util
import sys
from contextlib import nullcontext
from types import SimpleNamespace as NS
from unittest import mock


class _NoVision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # qwen3_5.py imports Qwen3-VL's processors, which import torchvision at module level; the
    # oracle calls only the model class's KV-state classmethods, so where torchvision is not
    # installed its modules are empty stand-ins that are never called.
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return mock.MagicMock(__path__=[], __spec__=spec, __name__=spec.name)

    def exec_module(self, module):
        pass


import torch
import transformers

from vllm.config.vllm import VllmConfig
from vllm.model_executor.models import ModelRegistry
from vllm.model_executor.models.config import MambaModelConfig, NemotronHForCausalLMConfig
from vllm.platforms.interface import Platform
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec, get_kv_quant_mode,
)
from vllm.v1.kv_cache_layout import KVCacheLayout


class FlashAttn(AttentionBackend):
    # FlashAttentionBackend.get_supported_kernel_block_sizes on CUDA (not importable on CPU).
    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(16)]

    @classmethod
    def customize_spec(cls, spec):
        return spec


def decoder_kinds(name, hf, n):
    # Which cache specs each layer registers, from vLLM's own decoder tables.
    if name in ("gpt_oss", "gpt_oss_13_12", "gemma3"):
        return [["sliding" if t == "sliding_attention" else "full"] for t in hf.layer_types]
    if name.startswith("gemma4"):
        # Gemma4Attention: the KV-shared tail reads an earlier layer's cache and registers none.
        first_shared = n - hf.num_kv_shared_layers
        return [[] if i >= first_shared else ["sliding" if t == "sliding_attention" else "full"]
                for i, t in enumerate(hf.layer_types)]
    if name in ("qwen3_next", "qwen3_5"):
        return [["mamba" if t == "linear_attention" else "full"] for t in hf.layer_types]
    if name == "falcon_h1":
        return [["full", "mamba"]] * n
    if name.startswith("deepseek_v32"):
        # DeepseekV2MLAAttention (IndexCache): a layer builds its indexer unless
        # max(i - index_skip_topk_offset + 1, 0) % index_topk_freq.
        freq, offset = getattr(hf, "index_topk_freq", 1), getattr(hf, "index_skip_topk_offset", 2)
        return [["mla"] + (["indexer"] if max(i - offset + 1, 0) % freq == 0 else []) for i in range(n)]
    module = importlib.import_module("vllm.model_executor.models." + name.replace("granite_h", "granitemoehybrid"))
    table = module.ALL_DECODER_LAYER_TYPES
    attr = {"nemotron_h": "hybrid_override_pattern", "jamba": "layers_block_type"}.get(name, "layer_types")
    types = getattr(hf, attr)
    kinds = []
    for t in types:
        cls = table[t].__name__
        kinds.append(["mamba"] if "Mamba" in cls else ["full"] if "Attention" in cls else [])
    return kinds


def run(case):
    name, tp, mem, kv_dtype, prefix = case["name"], case["tp"], case["mem"], case["kv_dtype"], case["prefix"]
    hf_cls, model_path, cfg = case["hf_class"], case["model"], case["config"]
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")}
    hf = getattr(transformers, hf_cls)(**kwargs)
    if name.startswith("gemma4"):
        # Gemma 4's head_dim and KV heads are per layer (read below per layer); the global values
        # stand for the sliding layers in the shared model stand-in.
        hf.allow_global_per_layer_attribute_access = True
    n = hf.num_hidden_layers
    kinds = decoder_kinds(name, hf, n)
    cache = NS(
        block_size=64 if name.startswith("deepseek_v32") else 16, user_specified_block_size=False, cache_dtype=kv_dtype,
        mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", mamba_cache_mode="none", mamba_block_size=None,
        mamba_page_size_padded=None, enable_prefix_caching=prefix, num_gpu_blocks_override=None,
        prefix_cache_retention_interval=None, kv_cache_dtype_skip_layers=None, use_replayssm=False,
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC,
    )
    model = NS(
        max_model_len=case["len"], original_max_model_len=case["len"], dtype=torch.bfloat16, hf_config=hf,
        hf_text_config=hf, use_mla=name.startswith("deepseek_v32"), architecture=model_path.split(":")[-1],
        get_num_kv_heads=lambda pc: max(1, hf.num_key_value_heads // tp),
        get_head_size=lambda: getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
    )
    cfg = NS(
        cache_config=cache, model_config=model,
        scheduler_config=NS(
            disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=case["mbt"], enable_chunked_prefill=True,
            async_scheduling=True,
        ),
        parallel_config=NS(
            decode_context_parallel_size=1, tensor_parallel_size=tp, pipeline_parallel_size=1,
            prefill_context_parallel_size=1,
        ),
        attention_config=NS(hisparse_config=None), speculative_config=None, num_speculative_tokens=0,
        num_prefill_lookahead_tokens=0, device_config=NS(device_type="cuda"),
        # Model Runner V2 is the GPU build's default (use_v2_model_runner): pp + 1 batches.
        use_v2_model_runner=True,
    )
    cfg.max_concurrent_batches = VllmConfig.max_concurrent_batches.fget(cfg)
    cfg.max_in_flight_tokens = VllmConfig.max_in_flight_tokens.fget(cfg)
    out = {}
    model_cls = None
    if model_path:
        module, cls_name = model_path.split(":")
        if name == "qwen3_5" and importlib.util.find_spec("torchvision") is None:
            sys.meta_path.append(_NoVision())  # after transformers decided it has no torchvision
        model_cls = getattr(importlib.import_module("vllm.model_executor.models." + module), cls_name)
        if name == "nemotron_h":
            NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache, hf_config=hf)
        if name == "qwen3_5":
            from vllm.model_executor.models.config import Qwen3_5ForConditionalGenerationConfig
            Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(cfg)
        MambaModelConfig.verify_and_update_config(cfg)
        with mock.patch.object(ModelRegistry, "resolve_model_cls", return_value=(model_cls, model.architecture)), \
                mock.patch.object(Platform, "_find_non_ssm_backends", return_value=[FlashAttn]), \
                mock.patch("vllm.config.vllm.set_current_vllm_config", lambda c: nullcontext()):
            Platform._align_hybrid_block_size(cfg, FlashAttn)
        shapes = model_cls.get_mamba_state_shape_from_config(cfg)
        dtypes = model_cls.get_mamba_state_dtype_from_config(cfg)
        out["mamba_state"] = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    dtype = torch.bfloat16 if kv_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv_dtype]
    head = model.get_head_size()
    specs = {}
    for i, layer in enumerate(kinds):
        # Gemma4DecoderLayer: each layer's head_dim and KV heads from per_layer_config.
        own = hf.per_layer_config[i] if name.startswith("gemma4") else None
        for kind in layer:
            heads = max(1, (own.num_key_value_heads if own else hf.num_key_value_heads) // tp)
            size = own.head_dim if own else head
            common = dict(block_size=cache.block_size, num_kv_heads=heads, head_size=size, dtype=dtype)
            if kind == "full":
                specs[f"{i}.attn"] = FullAttentionSpec(**common)
            elif kind == "sliding":
                specs[f"{i}.attn"] = SlidingWindowSpec(**common, sliding_window=hf.sliding_window)
            elif kind == "mamba":
                specs[f"{i}.mamba"] = MambaSpec(
                    shapes=shapes, dtypes=dtypes, block_size=cache.mamba_block_size,
                    page_size_padded=cache.mamba_page_size_padded, mamba_cache_mode=cache.mamba_cache_mode,
                )
            elif kind == "mla":
                from vllm.model_executor.layers.attention.mla_attention import _canonicalize_sparse_mla_kv_cache_dtype
                sparse = type("FlashMLASparse", (), {"get_name": staticmethod(lambda: "FLASHMLA_SPARSE")})
                cache_str = _canonicalize_sparse_mla_kv_cache_dtype(sparse, kv_dtype)
                specs[f"{i}.attn"] = MLAAttentionSpec(
                    block_size=cache.block_size, num_kv_heads=1, max_tp_shards=1,
                    head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                    dtype=torch.bfloat16 if cache_str == "auto" else torch.uint8, cache_dtype_str=cache_str,
                    kv_quant_mode=get_kv_quant_mode(cache_str),
                    state_content_bytes={"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}.get(cache_str),
                )
            elif kind == "indexer":
                from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
                with mock.patch("vllm.model_executor.models.deepseek_v2.get_current_vllm_config",
                                lambda: NS(compilation_config=NS(static_forward_context={}))):
                    layer_cache = DeepseekV32IndexerCache(
                        head_dim=hf.index_head_dim + hf.index_head_dim // 128 * 4, dtype=torch.uint8,
                        prefix=f"{i}.indexer", cache_config=cache,
                    )
                specs[f"{i}.indexer"] = layer_cache.get_kv_cache_spec(cfg)
    out["block_size"] = cache.block_size
    out["page_bytes"] = sorted({s.page_size_bytes for s in specs.values()})
    try:
        configs = ku.get_kv_cache_configs(cfg, [dict(specs)], [mem])
        out["refused"] = False
    except ValueError:
        out["refused"] = True
    groups = ku.get_kv_cache_groups(cfg, dict(specs))
    conf = ku.get_kv_cache_config_from_groups(cfg, groups, mem)
    if not out["refused"]:
        assert configs[0].num_blocks == conf.num_blocks
    sched = ku.generate_scheduler_kv_cache_config([conf])
    tokens, conc = ku.get_kv_cache_capacity(cfg, sched)
    bpb = ku._pool_bytes_per_block(cfg, groups)
    out.update(
        groups=len(groups), num_blocks=conf.num_blocks, tokens=tokens, concurrency=conc,
        fit=ku._estimate_max_model_len_from_groups(cfg, groups, mem - bpb),
    )
    return out


RESULT = [run(case) for case in DATA]
"""


@pytest.fixture(scope="module")
def vllm_side(oracle: OracleRun) -> list[dict[str, Any]]:
    data = [
        {
            "name": name,
            "tp": tp,
            "mem": mem,
            "kv_dtype": kv_dtype,
            "prefix": prefix,
            "hf_class": CONFIGS[name][0],
            "model": CONFIGS[name][1],
            "config": CONFIGS[name][2],
            "len": LEN,
            "mbt": MBT,
        }
        for name, tp, mem, kv_dtype, prefix in CASES
    ]
    result: list[dict[str, Any]] = oracle(ORACLE, data)
    return result


def planner(name: str, tp: int, mem: int, kv_dtype: str, prefix: bool) -> Estimate:
    spec = spec_from_config(CONFIGS[name][2], name)
    settings = Settings(
        tensor_parallel_size=tp,
        kv_cache_memory_bytes=mem,
        kv_cache_dtype=kv_dtype,
        enable_prefix_caching=prefix,
        max_model_len=LEN,
        max_num_batched_tokens=MBT,
    )
    return estimate(spec, H100, settings)


@pytest.mark.parametrize(
    ("index", "case"),
    list(enumerate(CASES)),
    ids=[f"{c[0]}-tp{c[1]}-{c[2]}-{c[3]}-{'pc' if c[4] else 'nopc'}" for c in CASES],
)
def test_kv_cache_like_vllm(vllm_side: list[dict[str, Any]], index: int, case: tuple[str, int, int, str, bool]) -> None:
    got = planner(*case)
    want = vllm_side[index]
    assert got.block_size == want["block_size"]
    assert got.num_gpu_blocks == want["num_blocks"]
    assert got.kv_cache_tokens == want["tokens"]
    assert got.max_concurrency == pytest.approx(want["concurrency"])
    assert got.max_model_len_fit == want["fit"]
    assert got.fits == (not want["refused"])
    assert got.parts().get("kv.groups", 1) == want["groups"]
    if "mamba_state" in want:
        spec = spec_from_config(CONFIGS[case[0]][2], case[0])
        count = sum(1 for i in range(spec.num_layers) if spec.has_mamba(i))
        assert got.parts()["kv.ssm_state_bytes_per_seq"] == count * want["mamba_state"]
