"""The options' memory against vLLM's own code (one oracle call for the module): the LoRA
A/B slots vLLM's layer wrappers allocate (``from_layer`` / ``from_layer_logits_processor``
on shrunk layers, at TP=1 and at TP=2 by giving the layers a rank-0-of-2 view), which model
classes give embeddings LoRA slots, the MTP n_predict ``SpeculativeConfig`` reads, and the
CUDA graph capture sizes of a speculative decode batch (``VllmConfig._set_cudagraph_sizes``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.oracle.conftest import OracleRun
from vllm_fleet.accounting import options
from vllm_fleet.accounting.activation import _capture_sizes
from vllm_fleet.model.spec import ModelSpec, spec_from_config

TINY = ModelSpec(
    name="tiny",
    model_type="llama",
    num_layers=1,
    hidden_size=256,
    num_attention_heads=8,
    num_kv_heads=4,
    head_dim=32,
    intermediate_size=512,
    vocab_size=1000,
    max_position_embeddings=4096,
)
LORA_CASES = [
    {"tp": 1, "full": False, "rank": 8, "slots": 3},
    {"tp": 2, "full": False, "rank": 16, "slots": 2},
    {"tp": 2, "full": True, "rank": 16, "slots": 2},
]
ARCHS = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Gemma3ForCausalLM": "gemma3_text",
    "Glm4MoeForCausalLM": "glm4_moe",
}
MTP_CONFIGS = [
    {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "num_nextn_predict_layers": 1},
    {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "num_nextn_predict_layers": 1},
    {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_nextn_predict_layers": 2},
]
GRAPH_CASES = [
    {"seqs": 64, "tokens": 8192, "k": 3},
    {"seqs": 256, "tokens": 8192, "k": 1},
    {"seqs": 8, "tokens": 2048, "k": 4},
]

CODE = r"""
import torch
from types import SimpleNamespace
from unittest import mock
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import init_distributed_environment, initialize_model_parallel

ctx = set_current_vllm_config(VllmConfig())
ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, local_rank=0,
                             distributed_init_method="tcp://127.0.0.1:29571", backend="gloo")
initialize_model_parallel(1)

import vllm.model_executor.layers.linear as linear
import vllm.model_executor.layers.vocab_parallel_embedding as vocab
import vllm.lora.layers.logits_processor as lora_logits
from vllm.config.lora import LoRAConfig
from vllm.lora.utils import from_layer, from_layer_logits_processor
from vllm.model_executor.layers.logits_processor import LogitsProcessor

def nbytes(wrapper):
    total = 0
    for name in ("lora_a_stacked", "lora_b_stacked"):
        value = getattr(wrapper, name)
        for t in (value if isinstance(value, (tuple, list)) else [value]):
            total += t.numel() * t.element_size()
    return total

lora = []
for case in DATA["lora"]:
    tp = case["tp"]
    patches = [mock.patch.object(m, f, lambda tp=tp: tp) for m in (linear, vocab, lora_logits)
               for f in ("get_tensor_model_parallel_world_size",) if hasattr(m, f)]
    patches += [mock.patch.object(m, f, lambda: 0) for m in (linear, vocab, lora_logits)
                for f in ("get_tensor_model_parallel_rank",) if hasattr(m, f)]
    for p in patches:
        p.start()
    cfg = LoRAConfig(max_lora_rank=case["rank"], max_loras=case["slots"], lora_dtype=torch.bfloat16,
                     fully_sharded_loras=case["full"])
    h, heads, kv, hd, inter, v = 256, 8, 4, 32, 512, 1000
    bf = torch.bfloat16
    qkv = linear.QKVParallelLinear(h, hd, heads, kv, bias=False, params_dtype=bf)
    o = linear.RowParallelLinear(heads * hd, h, bias=False, params_dtype=bf)
    gate_up = linear.MergedColumnParallelLinear(h, [inter, inter], bias=False, params_dtype=bf)
    down = linear.RowParallelLinear(inter, h, bias=False, params_dtype=bf)
    embed = vocab.VocabParallelEmbedding(v, h, params_dtype=bf)
    head = vocab.ParallelLMHead(v, h, params_dtype=bf)
    wrapped = {
        "qkv": from_layer(qkv, case["slots"], cfg, ["q_proj", "k_proj", "v_proj"], None),
        "o": from_layer(o, case["slots"], cfg, [], None),
        "gate_up": from_layer(gate_up, case["slots"], cfg, ["gate_proj", "up_proj"], None),
        "down": from_layer(down, case["slots"], cfg, [], None),
        "embed": from_layer(embed, case["slots"], cfg, [], None),
        "logits": from_layer_logits_processor(LogitsProcessor(v), head, case["slots"], cfg, None),
    }
    lora.append({k: [type(w).__name__, nbytes(w)] for k, w in wrapped.items()})
    for p in patches:
        p.stop()

from vllm.model_executor.models.registry import ModelRegistry
archs = {}
for arch in DATA["archs"]:
    cls = ModelRegistry._try_load_model_cls(arch)
    archs[arch] = [bool(getattr(cls, "embedding_modules", {})), bool(getattr(cls, "is_3d_moe_weight", False))]

from transformers import PretrainedConfig
from vllm.config.speculative import SpeculativeConfig
mtp = []
for raw in DATA["mtp"]:
    out = SpeculativeConfig.hf_config_override(PretrainedConfig(**raw))
    mtp.append([out.model_type, getattr(out, "n_predict", None)])

graphs = []
for case in DATA["graphs"]:
    fake = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
                                           max_cudagraph_capture_size=None, cudagraph_capture_sizes=None,
                                           post_init_cudagraph_sizes=lambda: None, compile_sizes=[]),
        scheduler_config=SimpleNamespace(max_num_seqs=case["seqs"], max_num_batched_tokens=case["tokens"]),
        speculative_config=SimpleNamespace(uses_dynamic_speculative_decoding=lambda: False),
        uniform_decode_query_len=1 + case["k"],
        performance_mode="throughput",
        parallel_config=SimpleNamespace(tensor_parallel_size=1, data_parallel_size=1),
    )
    try:
        VllmConfig._set_cudagraph_sizes(fake)
    except AttributeError:
        pass  # what follows the sizes (sequence parallelism, pass configs) needs more of the config
    graphs.append(sorted(fake.compilation_config.cudagraph_capture_sizes or []))

RESULT = {"lora": lora, "archs": archs, "mtp": mtp, "graphs": graphs}
"""


@pytest.fixture(scope="module")
def vllm_says(oracle: OracleRun) -> dict[str, Any]:
    data = {"lora": LORA_CASES, "archs": list(ARCHS), "mtp": MTP_CONFIGS, "graphs": GRAPH_CASES}
    result: dict[str, Any] = oracle(CODE, data)
    return result


@pytest.mark.parametrize("index", range(len(LORA_CASES)))
def test_lora_slots_match_vllms_wrappers(vllm_says: dict[str, Any], index: int) -> None:
    case = LORA_CASES[index]
    found = vllm_says["lora"][index]
    settings = _settings(case)
    tp = case["tp"]
    per_layer = options.lora_bytes(TINY, [0], False, False, tp, 1, settings, 2)
    both_ends = options.lora_bytes(TINY, [], True, True, tp, 1, settings, 2)
    vllm_layer = sum(found[k][1] for k in ("qkv", "o", "gate_up", "down"))
    assert per_layer == vllm_layer, found
    assert both_ends == found["embed"][1] + found["logits"][1], found
    if case["full"]:
        assert found["qkv"][0].endswith("ShardedLoRA")


def _settings(case: dict[str, Any]) -> Any:
    from vllm_fleet.accounting.settings import Settings

    return Settings(
        enable_lora=True,
        max_loras=case["slots"],
        max_lora_rank=case["rank"],
        lora_dtype="bfloat16",
        fully_sharded_loras=case["full"],
    )


def test_which_models_give_embeddings_lora_slots(vllm_says: dict[str, Any]) -> None:
    for arch, model_type in ARCHS.items():
        embeds, is_3d = vllm_says["archs"][arch]
        assert (model_type in options.LORA_EMBEDDING_MODEL_TYPES) == embeds, arch
        assert (model_type in options.LORA_3D_MOE_MODEL_TYPES) == is_3d, arch


def test_mtp_n_predict_is_what_the_planner_reads(vllm_says: dict[str, Any]) -> None:
    for raw, (model_type, n_predict) in zip(MTP_CONFIGS, vllm_says["mtp"], strict=True):
        cfg = {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 1000,
            "max_position_embeddings": 4096,
        } | raw
        spec = spec_from_config(cfg, name=raw["model_type"])
        assert model_type.endswith("_mtp") and spec.mtp_layers == n_predict
        resolved = options.resolve_speculative(spec, _spec_settings({"method": model_type}))
        assert resolved is not None and resolved.method == "mtp"
        assert (resolved.num_speculative_tokens, resolved.draft_layers) == (n_predict, n_predict)


def _spec_settings(config: dict[str, Any]) -> Any:
    from vllm_fleet.accounting.settings import Settings

    return Settings(speculative_config=config)


@pytest.mark.parametrize("index", range(len(GRAPH_CASES)))
def test_speculative_capture_sizes_match_vllm(vllm_says: dict[str, Any], index: int) -> None:
    case = GRAPH_CASES[index]
    found = vllm_says["graphs"][index]
    assert found, "vLLM computed no capture sizes"
    ours = _capture_sizes(case["seqs"], case["tokens"], 1 + case["k"])
    # vLLM also appends max_num_batched_tokens when it is below the ceiling, not the case here.
    assert ours == found
