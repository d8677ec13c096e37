"""Llama 4's text model against vLLM 0.32's own classes, on shrunk configs.

One oracle call builds ``Llama4ForCausalLM`` on the meta device for each config (a
Scout-like one with a MoE layer everywhere and a Maverick-like one with
``interleave_moe_layer_step`` 2 and its own ``no_rope_layers``), counts the parameters of
every decoder layer, the embedding and the head, reads the rotary cache, asks each
attention layer for its KV cache spec, and sizes the KV cache with
``get_kv_cache_configs`` / ``get_kv_cache_capacity`` with the hybrid KV cache manager on
(vLLM's default) and off (``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.oracle.conftest import OracleRun
from vllm_fleet.accounting.base import GIB, Accounting
from vllm_fleet.accounting.kv import _in_flight_batches
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.parts import _layer_bytes
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.spec import spec_from_config

BASE: dict[str, Any] = {
    "architectures": ["Llama4ForCausalLM"],
    "model_type": "llama4_text",
    "hidden_size": 64,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "vocab_size": 500,
    "max_position_embeddings": 32768,
    "attention_chunk_size": 128,
    "rope_theta": 500000.0,
    "rope_scaling": None,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "scout": {**BASE, "interleave_moe_layer_step": 1, "use_qk_norm": True},
    "maverick": {
        **BASE,
        "interleave_moe_layer_step": 2,
        "use_qk_norm": False,
        "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 1],  # one full layer: 7 chunked groups of 1
    },
}
# Below one chunk, below chunk + in-flight tokens, many chunks; the in-flight tokens
# (max_num_batched_tokens MBT, times vLLM's concurrent batches) are what a chunked layer
# holds beyond its chunk.
LENGTHS = [100, 300, 16384]
MBT = 256
AVAILABLE = 64 << 20  # bytes for the KV cache
BLOCK = 16

ORACLE_CODE = r"""
import os, json, tempfile, torch
from vllm.config import VllmConfig, ModelConfig, CacheConfig, SchedulerConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, ensure_model_parallel_initialized
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs, get_kv_cache_capacity

def config(folder, length):
    model = ModelConfig(model=folder, skip_tokenizer_init=True, max_model_len=length, dtype="bfloat16")
    sched = SchedulerConfig.default_factory(max_num_batched_tokens=DATA["mbt"], max_num_seqs=16, max_model_len=length)
    vc = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=DATA["block"]), scheduler_config=sched)
    # The engine core resolves the layout before sizing (resolve_kv_cache_layout); one page
    # size for every layer, so the layout does not change the groups.
    vc.cache_config.kv_cache_layout = "NHD"
    return vc

out = {}
started = False
for name, cfg in DATA["configs"].items():
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    os.environ.pop("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", None)
    vc = config(folder, DATA["lengths"][-1])
    from vllm.model_executor.models.llama4 import Llama4ForCausalLM
    with set_current_vllm_config(vc):
        if not started:
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"file://{tempfile.mktemp()}", backend="gloo")
            ensure_model_parallel_initialized(1, 1)
            started = True
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("meta"):
            model = Llama4ForCausalLM(vllm_config=vc)
        layers = model.model.layers
        specs = {f"model.layers.{i}.self_attn.attn": l.self_attn.attn.get_kv_cache_spec(vc)
                 for i, l in enumerate(layers)}
    count = lambda m: sum(p.numel() for p in m.parameters())
    rotary = {id(b): b.numel() for n, b in model.named_buffers() if n.endswith("cos_sin_cache")}
    res = {
        "layers": [count(l) for l in layers],
        "moe": [type(l.feed_forward).__name__ == "Llama4MoE" for l in layers],
        "embed": count(model.model.embed_tokens),
        "head": count(model.lm_head),
        "norm": count(model.model.norm),
        "rotary": sum(rotary.values()),
        "kv_specs": [[type(s).__name__, s.page_size_bytes, getattr(s, "attention_chunk_size", None)]
                     for s in specs.values()],
        "kv": {},
    }
    for hybrid in (True, False):
        if hybrid:
            os.environ.pop("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", None)
        else:
            os.environ["VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"] = "0"
        rows = []
        for length in DATA["lengths"]:
            vcl = config(folder, length)
            kcfg = get_kv_cache_configs(vcl, [dict(specs)], [DATA["available"]])[0]
            tokens, conc = get_kv_cache_capacity(vcl, kcfg)
            rows.append({
                "length": length,
                "disabled": vcl.scheduler_config.disable_hybrid_kv_cache_manager,
                "in_flight": vcl.max_in_flight_tokens,
                "mbt": vcl.scheduler_config.max_num_batched_tokens,
                "groups": [[type(g.kv_cache_spec).__name__, len(g.layer_names)] for g in kcfg.kv_cache_groups],
                "num_blocks": kcfg.num_blocks,
                "tokens": tokens,
                "concurrency": conc,
            })
        res["kv"]["on" if hybrid else "off"] = rows
    out[name] = res
RESULT = out
"""


@pytest.fixture(scope="module")
def truth(oracle: OracleRun) -> dict[str, Any]:
    data = {"configs": CONFIGS, "lengths": LENGTHS, "available": AVAILABLE, "block": BLOCK, "mbt": MBT}
    result: dict[str, Any] = oracle(ORACLE_CODE, data)
    return result


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameters_per_layer(truth: dict[str, Any], name: str) -> None:
    spec = spec_from_config(CONFIGS[name], name)
    got = truth[name]
    assert [spec.is_moe_layer(i) for i in range(spec.num_layers)] == got["moe"]
    acct = Accounting.for_version("0.32.0")
    # bf16: two bytes a parameter.
    planner = [_layer_bytes(spec, i, 1, 1, None, 2, acct) / 2 for i in range(spec.num_layers)]
    assert planner == got["layers"]
    est = estimate(spec, Device("test", 64.0), Settings(max_model_len=LENGTHS[-1], enforce_eager=True))
    total = sum(got["layers"]) + got["embed"] + got["head"] + got["norm"] + got["rotary"]
    assert est.weights_gib * GIB / 2 == total


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kv_spec_per_layer(truth: dict[str, Any], name: str) -> None:
    spec = spec_from_config(CONFIGS[name], name)
    kinds = {"ChunkedLocalAttentionSpec": "chunked", "FullAttentionSpec": "full"}
    assert [kinds[k] for k, _, _ in truth[name]["kv_specs"]] == list(spec.layer_types)
    page = BLOCK * 2 * spec.num_kv_heads * spec.head_dim * 2
    assert {p for _, p, _ in truth[name]["kv_specs"]} == {page}
    assert {c for k, _, c in truth[name]["kv_specs"] if k.startswith("Chunked")} == {spec.attention_chunk_size}


@pytest.mark.parametrize("hybrid", [True, False])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kv_blocks_tokens_and_concurrency(truth: dict[str, Any], name: str, hybrid: bool) -> None:
    spec = spec_from_config(CONFIGS[name], name)
    # The planner reserves max_num_batched_tokens x its in-flight batches for local attention
    # (a GPU's async scheduling: pp + 1); the oracle's host resolved vLLM's own
    # max_in_flight_tokens (one batch there): the planner is given the batch size that
    # makes its in-flight tokens vLLM's.
    batches = _in_flight_batches(Accounting.for_version("0.32.0"), 1, "cuda")
    for row in truth[name]["kv"]["on" if hybrid else "off"]:
        assert row["disabled"] is (not hybrid)
        assert row["in_flight"] % batches == 0, row
        settings = Settings(
            max_model_len=row["length"],
            # The planner's in-flight tokens for local attention: vLLM's max_in_flight_tokens.
            max_num_batched_tokens=row["in_flight"] // batches,
            max_num_seqs=16,  # as the oracle's SchedulerConfig (vLLM refuses batched tokens below it)
            block_size=BLOCK,
            kv_cache_memory_bytes=AVAILABLE,
            chunked_local_attn_hybrid_kv=hybrid,
        )
        est = estimate(spec, Device("test", 64.0), settings)
        assert est.num_gpu_blocks == row["num_blocks"], row
        assert est.max_concurrency == pytest.approx(row["concurrency"], rel=1e-12), row
        assert est.kv_cache_tokens == row["tokens"], row
        if not hybrid:
            assert row["groups"] == [["FullAttentionSpec", spec.num_layers]]
