"""The planner's weights of the hybrid families against the models vLLM builds.

vLLM's CPU build instantiates each model class on the meta device from a shrunk config.json
(one process, TP=1); the bytes of its parameters and persistent buffers (the rotary cache
once, Falcon-H1's mup vectors; not MambaMixer2's ``conv_weights``, a view of conv1d's
weight, nor the 4-byte attention scales) are what the planner's weights must equal, since
the planner counts these layers parameter by parameter (scalar buffers, Gemma 4's normalizer and
layer scalars, are left out on both sides). Left out: DeepSeek V3.2 (its
sparse-attention layers need an accelerator to be built) and Nemotron-H's MoE blocks
(vLLM's CPU build has no backend for non-gated experts); tests/unit/test_kv_families.py
derives both.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.oracle.conftest import TORCHVISION_STUB, OracleRun
from tests.oracle.test_kv_oracle import CONFIGS
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Device, Settings
from vllm_fleet.model.spec import spec_from_config

H100 = Device("H100-SXM", 79.19, "cuda", 9)
ARCHITECTURES = {
    "qwen3_next": "Qwen3NextForCausalLM",
    "granite_h": "GraniteMoeHybridForCausalLM",
    "granite_h_moe": "GraniteMoeHybridForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "jamba": "JambaForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
}
_EXTRA: dict[str, tuple[str, dict[str, Any]]] = {
    "granite_h_moe": (
        "granite_h",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 128, "position_embedding_type": "rope"},
    ),
    "qwen3_next": ("qwen3_next", {"partial_rotary_factor": 0.25}),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}),
}


# Gemma 4 (gemma4.py): sliding layers at head_dim 64, full ones at their own; per-layer
# embeddings; a KV-shared tail with only q_proj (double-wide MLP there in the MoE case); the MoE
# block beside the dense MLP; attention_k_eq_v with global KV heads; an untied head with a
# partially rotated full-attention RoPE.
_GEMMA4: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 6, "sliding_window": 128, "vocab_size": 1000, "vocab_size_per_layer_input": 1000,
    "hidden_size_per_layer_input": 32, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
}  # fmt: skip
MODELS_2026: dict[str, dict[str, Any]] = {
    "gemma4": dict(_GEMMA4, per_layer_config={"2": {"head_dim": 128}, "5": {"head_dim": 128}}, num_kv_shared_layers=2),
    "gemma4_moe": dict(
        _GEMMA4, global_head_dim=128, num_kv_shared_layers=2, num_experts=4, top_k_experts=2,
        moe_intermediate_size=64, use_double_wide_mlp=True, attention_k_eq_v=True, num_global_key_value_heads=1,
    ),
    "gemma4_untied": dict(
        _GEMMA4, global_head_dim=128, hidden_size_per_layer_input=0, tie_word_embeddings=False,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "partial_rotary_factor": 0.5, "rope_theta": 1e6},
        },
    ),
}  # fmt: skip
# Gemma 4 with its towers (gemma4_mm.py: transformers' Gemma4VisionModel and Gemma4AudioModel, a
# Gemma4MultimodalEmbedder each): standardized vision with GQA, a two-layer audio Conformer. Their
# buffers (the vision rotary's inv_freq, std_bias / std_scale, the audio relative-position
# timescales: under 2 KiB) are left out on both sides.
MODELS_2026["gemma4_mm"] = {
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "text_config": {k: v for k, v in _GEMMA4.items() if k != "architectures"},
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 128, "intermediate_size": 256,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                      "patch_size": 8, "position_embedding_size": 512, "standardize": True},
    "audio_config": {"model_type": "gemma4_audio", "hidden_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "subsampling_conv_channels": [64, 16], "conv_kernel_size": 5,
                     "output_proj_dims": 192},
}  # fmt: skip
# MiniMax-M2 (minimax_m2.py): q/k norms over all heads' dims, rotary_dim of 64, an fp32 gate
# and, with use_routing_bias, an fp32 correction bias per expert.
MODELS_2026["minimax_m2"] = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 256,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": False, "rotary_dim": 32,
    "use_qk_norm": True, "qk_norm_type": "per_layer", "scoring_func": "sigmoid", "use_routing_bias": True,
}  # fmt: skip


def config(name: str) -> dict[str, Any]:
    if name in MODELS_2026:
        return MODELS_2026[name]
    base, extra = _EXTRA.get(name, (name, {}))
    cfg = dict(CONFIGS[base][2], **extra)
    cfg.update(architectures=[ARCHITECTURES[name]], tie_word_embeddings=False, max_position_embeddings=4096)
    return cfg


ORACLE = (
    TORCHVISION_STUB
    + """
import json, os, sys, tempfile

import torch
from vllm.config import LoadConfig, ModelConfig, VllmConfig
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.models import ModelRegistry

RESULT = {}
started = False
for name, cfg in DATA.items():
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    model_config = ModelConfig(model=folder, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096)
    vllm_config = VllmConfig(model_config=model_config, load_config=LoadConfig(load_format="dummy"))
    with set_current_vllm_config(vllm_config):
        if not started:
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:29517", local_rank=0, backend="gloo"
            )
            initialize_model_parallel(1)
            started = True
        cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("meta"):
            model = cls(vllm_config=vllm_config)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(
        b.numel() * b.element_size()
        for n, b in model.named_buffers()
        if not n.endswith("conv_weights") and not n.endswith("_scale") and b.numel() > 1
        and not n.startswith(("vision_tower.", "audio_tower."))
    )
    RESULT[name] = {"params": params, "buffers": buffers}
"""
)


@pytest.fixture(scope="module")
def built(oracle: OracleRun) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = oracle(ORACLE, {name: config(name) for name in [*ARCHITECTURES, *MODELS_2026]})
    return result


@pytest.mark.parametrize("name", [*ARCHITECTURES, *MODELS_2026])
def test_weights_are_the_parameters_vllm_builds(built: dict[str, dict[str, int]], name: str) -> None:
    spec = spec_from_config(config(name), name)
    est = estimate(spec, H100, Settings(max_model_len=4096))
    vllm_bytes = built[name]["params"] + built[name]["buffers"]
    assert est.weights_gib * (1 << 30) == pytest.approx(vllm_bytes, rel=1e-9)
