"""Built-in catalogs: common open models (their config.json values) and GPUs.

Model entries hold the fields of the model's public config.json that the
planner reads, so a catalog name and a downloaded folder plan identically.
GPU memory is what the driver reports as total memory (``torch.cuda.
mem_get_info`` / vLLM's ``total_gpu_memory``), in GiB, not the marketing size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_fleet.model.catalog_2026 import ALIASES_2026, MODELS_2026


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int = 128256,
    max_pos: int = 131072,
    tied: bool = False,
    head_dim: int | None = None,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tied,
        "torch_dtype": dtype,
    }
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


def _qwen2(
    layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, tied: bool, max_pos: int = 32768
) -> dict[str, Any]:
    return {**_llama(layers, hidden, heads, kv, inter, vocab, max_pos, tied), "model_type": "qwen2"}


def _qwen3(
    layers: int, hidden: int, heads: int, kv: int, inter: int, tied: bool, max_pos: int = 40960, **moe: Any
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "qwen3_moe" if moe else "qwen3",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 128,
        "intermediate_size": inter,
        "vocab_size": 151936,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    cfg.update(moe)
    return cfg


_DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "num_nextn_predict_layers": 1,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    """openai/gpt-oss-20b / -120b: config.json as vendored in ai-dynamo/aiconfigurator
    aic-core/src/aiconfigurator_core/model_configs/openai--gpt-oss-{20b,120b}_config.json (commit 0b077da5).
    The two files differ only in num_hidden_layers, num_local_experts and layer_types (sliding and full
    attention alternating from layer 0). The file names no torch_dtype (vLLM then serves bfloat16)."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": 200002,
        "experts_per_token": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "num_local_experts": experts,
        "output_router_logits": False,
        "pad_token_id": 199999,
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": 201088,
    }


def _mixtral(layers: int, hidden: int, heads: int, inter: int, vocab: int, max_pos: int) -> dict[str, Any]:
    return {
        "model_type": "mixtral",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "intermediate_size": inter,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def _gemma(
    model_type: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    head_dim: int,
    inter: int,
    vocab: int,
    window: int,
    max_pos: int,
    vision: int = 0,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "sliding_window": window,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    if vision:
        cfg["vision_params"] = vision
    return cfg


MODELS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": _llama(32, 4096, 32, 32, 11008, 32000, 4096, dtype="float16"),
    "meta-llama/Llama-2-70b-hf": _llama(80, 8192, 64, 8, 28672, 32000, 4096, dtype="float16"),
    "meta-llama/Meta-Llama-3-8B": _llama(32, 4096, 32, 8, 14336, max_pos=8192),
    "meta-llama/Meta-Llama-3-70B": _llama(80, 8192, 64, 8, 28672, max_pos=8192),
    "meta-llama/Llama-3.1-8B": _llama(32, 4096, 32, 8, 14336),
    "meta-llama/Llama-3.1-70B": _llama(80, 8192, 64, 8, 28672),
    "meta-llama/Llama-3.1-405B": _llama(126, 16384, 128, 8, 53248),
    "meta-llama/Llama-3.2-1B": _llama(16, 2048, 32, 8, 8192, tied=True, head_dim=64),
    "meta-llama/Llama-3.2-3B": _llama(28, 3072, 24, 8, 8192, tied=True, head_dim=128),
    "meta-llama/Llama-3.3-70B-Instruct": _llama(80, 8192, 64, 8, 28672),
    "Qwen/Qwen2.5-0.5B": _qwen2(24, 896, 14, 2, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B": _qwen2(28, 1536, 12, 2, 8960, 151936, True),
    "Qwen/Qwen2.5-Math-1.5B": _qwen2(28, 1536, 12, 2, 8960, 151936, True, 4096),
    "Qwen/Qwen2.5-3B": _qwen2(36, 2048, 16, 2, 11008, 151936, True),
    "Qwen/Qwen2.5-7B": _qwen2(28, 3584, 28, 4, 18944, 152064, False),
    "Qwen/Qwen2.5-14B": _qwen2(48, 5120, 40, 8, 13824, 152064, False),
    "Qwen/Qwen2.5-32B": _qwen2(64, 5120, 40, 8, 27648, 152064, False),
    "Qwen/Qwen2.5-72B": _qwen2(80, 8192, 64, 8, 29568, 152064, False),
    "Qwen/Qwen3-0.6B": _qwen3(28, 1024, 16, 8, 3072, True),
    "Qwen/Qwen3-4B": _qwen3(36, 2560, 32, 8, 9728, True),
    "Qwen/Qwen3-8B": _qwen3(36, 4096, 32, 8, 12288, False),
    "Qwen/Qwen3-14B": _qwen3(40, 5120, 40, 8, 17408, False),
    "Qwen/Qwen3-32B": _qwen3(64, 5120, 64, 8, 25600, False),
    "Qwen/Qwen3-30B-A3B": _qwen3(
        48,
        2048,
        32,
        4,
        6144,
        False,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        decoder_sparse_step=1,
    ),
    "Qwen/Qwen3-235B-A22B": _qwen3(
        94,
        4096,
        64,
        4,
        12288,
        False,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=1536,
        decoder_sparse_step=1,
    ),
    "deepseek-ai/DeepSeek-V3": _DEEPSEEK_V3,
    "deepseek-ai/DeepSeek-R1": _DEEPSEEK_V3,
    "mistralai/Mixtral-8x7B-v0.1": _mixtral(32, 4096, 32, 14336, 32000, 32768),
    "mistralai/Mixtral-8x22B-v0.1": _mixtral(56, 6144, 48, 16384, 32768, 65536),
    "openai/gpt-oss-20b": _gpt_oss(24, 32),
    "openai/gpt-oss-120b": _gpt_oss(36, 128),
    "google/gemma-2-9b": _gemma("gemma2", 42, 3584, 16, 8, 256, 14336, 256000, 4096, 8192),
    "google/gemma-2-27b": _gemma("gemma2", 46, 4608, 32, 16, 128, 36864, 256000, 4096, 8192),
    "google/gemma-3-12b-it": _gemma("gemma3", 48, 3840, 16, 8, 256, 15360, 262208, 1024, 131072, vision=417_000_000),
    "google/gemma-3-27b-it": _gemma("gemma3", 62, 5376, 32, 16, 128, 21504, 262208, 1024, 131072, vision=417_000_000),
    **MODELS_2026,
}

# Names people use for the same weights (instruct/chat variants share the architecture).
_ALIASES: dict[str, str] = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Meta-Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B-Instruct": "meta-llama/Llama-3.1-405B",
    "meta-llama/Llama-3.2-1B-Instruct": "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B-Instruct": "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-2-7b-chat-hf": "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-70b-chat-hf": "meta-llama/Llama-2-70b-hf",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B",
    "Qwen/Qwen2.5-3B-Instruct": "Qwen/Qwen2.5-3B",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B",
    "Qwen/Qwen2.5-14B-Instruct": "Qwen/Qwen2.5-14B",
    "Qwen/Qwen2.5-32B-Instruct": "Qwen/Qwen2.5-32B",
    "Qwen/Qwen2.5-72B-Instruct": "Qwen/Qwen2.5-72B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "mistralai/Mixtral-8x22B-Instruct-v0.1": "mistralai/Mixtral-8x22B-v0.1",
    "google/gemma-2-9b-it": "google/gemma-2-9b",
    "google/gemma-2-27b-it": "google/gemma-2-27b",
    **ALIASES_2026,
}


def lookup_model(name: str) -> dict[str, Any] | None:
    """Config dict for a catalog name (case-insensitive, org prefix optional)."""
    wanted = _ALIASES.get(name, name)
    lowered = wanted.lower()
    for key, cfg in MODELS.items():
        if key.lower() == lowered or key.lower().split("/")[-1] == lowered:
            return dict(cfg)
    for alias, target in _ALIASES.items():
        if alias.lower() == lowered or alias.lower().split("/")[-1] == lowered:
            return dict(MODELS[target])
    return None


# Compute capability x 10 of each architecture (its lowest member: A10/A40 are 8.6,
# Ampere's 8.0 is what vLLM's thresholds compare with): for a GPU the catalog does not know.
ARCH_CAPABILITY: dict[str, int] = {
    "volta": 70,
    "turing": 75,
    "ampere": 80,
    "ada": 89,
    "hopper": 90,
    "blackwell": 100,
    "cdna3": 94,
}


@dataclass(frozen=True)
class GpuType:
    """A GPU model as the driver reports it."""

    name: str
    memory_gib: float  # total memory CUDA reports (torch.cuda.mem_get_info), GiB
    arch: str
    nvlink: bool
    capability: int  # compute capability x 10 (torch.cuda.get_device_capability): 120 for sm_120
    device: str = "cuda"  # "cuda", "rocm" or "cpu"
    # An integrated GPU (cudaDevAttrIntegrated, torch's ``is_integrated``) that shares the host's
    # memory: vLLM reads the host's MemAvailable as its free memory (MemorySnapshot.measure).
    unified_memory: bool = False
    # Peer-to-peer access over PCIe, which vLLM's custom all-reduce needs (_can_p2p): the driver
    # gives GeForce cards none without an NVLink bridge.
    p2p: bool = True


GPUS: dict[str, GpuType] = {
    g.name.lower(): g
    for g in (
        GpuType("H100-SXM", 79.19, "hopper", True, 90),
        GpuType("H100-PCIe", 79.19, "hopper", False, 90),
        GpuType("H100-NVL", 93.10, "hopper", True, 90),
        GpuType("H200", 139.81, "hopper", True, 90),
        GpuType("H20", 95.00, "hopper", True, 90),
        GpuType("H800", 79.19, "hopper", True, 90),
        # Grace Hopper, 96 GB HBM3 (torch reports 94.88 GiB, Lightning-AI/litgpt issue 1892): discrete
        # to CUDA; its HBM is a NUMA node the OS may fill with page cache, which gpu_facts' free
        # memory then shows.
        GpuType("GH200", 94.88, "hopper", True, 90),
        GpuType("B200", 178.36, "blackwell", True, 100),
        GpuType("GB200", 184.00, "blackwell", True, 100),
        GpuType("A100-80G", 79.15, "ampere", True, 80),
        GpuType("A100-40G", 39.39, "ampere", True, 80),
        GpuType("A800", 79.15, "ampere", True, 80),
        GpuType("A10", 22.07, "ampere", False, 86),
        GpuType("A10G", 22.07, "ampere", False, 86),
        GpuType("A40", 44.35, "ampere", False, 86),
        GpuType("L40S", 44.39, "ada", False, 89),
        GpuType("L40", 44.39, "ada", False, 89),
        GpuType("L20", 44.39, "ada", False, 89),
        GpuType("L4", 22.03, "ada", False, 89),
        GpuType("RTX-6000-Ada", 47.50, "ada", False, 89),
        GpuType("RTX-A6000", 47.53, "ampere", False, 86),
        GpuType("RTX-PRO-6000", 94.97, "blackwell", False, 120),
        # DGX Spark: CUDA's total is the host's memory (121.69 GiB on a 128 GB Spark; nvidia-smi
        # prints "[N/A]" for its memory), shared with the OS and vLLM's own processes.
        GpuType("GB10", 121.69, "blackwell", False, 121, unified_memory=True),
        GpuType("RTX-4090", 23.52, "ada", False, 89, p2p=False),
        GpuType("RTX-3090", 23.58, "ampere", False, 86, p2p=False),
        GpuType("RTX-2000-Ada", 15.59, "ada", False, 89),
        GpuType("T4", 14.56, "turing", False, 75),
        GpuType("V100-32G", 31.74, "volta", True, 70),
        GpuType("V100-16G", 15.77, "volta", True, 70),
        GpuType("MI300X", 191.98, "cdna3", True, 94, "rocm"),
        GpuType("CPU", 0.0, "cpu", False, 0, "cpu"),
    )
}

_GPU_ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "h100-80g": "h100-sxm",
    "nvidia h100 80gb hbm3": "h100-sxm",
    "nvidia h100 pcie": "h100-pcie",
    "nvidia h200": "h200",
    "nvidia h20": "h20",
    "a100": "a100-80g",
    "a100-80gb": "a100-80g",
    "a100-sxm4-80gb": "a100-80g",
    "nvidia a100-sxm4-80gb": "a100-80g",
    "nvidia a100 80gb pcie": "a100-80g",
    "a100-40gb": "a100-40g",
    "nvidia a100-sxm4-40gb": "a100-40g",
    "a800-80g": "a800",
    "nvidia a800-sxm4-80gb": "a800",
    "nvidia a800 80gb pcie": "a800",
    "nvidia l20": "l20",
    "nvidia l40s": "l40s",
    "nvidia l40": "l40",
    "nvidia l4": "l4",
    "nvidia a10": "a10",
    "nvidia a10g": "a10g",
    "tesla t4": "t4",
    "nvidia geforce rtx 4090": "rtx-4090",
    "nvidia geforce rtx 3090": "rtx-3090",
    "4090": "rtx-4090",
    "3090": "rtx-3090",
    "b200": "b200",
    "nvidia b200": "b200",
    "nvidia gb10": "gb10",
    "nvidia gh200 480gb": "gh200",
    "dgx-spark": "gb10",
    "nvidia rtx pro 6000 blackwell server edition": "rtx-pro-6000",
    "nvidia rtx pro 6000 blackwell workstation edition": "rtx-pro-6000",
    "tesla v100-sxm2-32gb": "v100-32g",
    "v100": "v100-32g",
}


def lookup_gpu(name: str) -> GpuType | None:
    """GPU type for a catalog name or an ``nvidia-smi`` product name."""
    key = name.strip().lower().replace("_", "-")
    key = _GPU_ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    spaced = key.replace("-", " ")
    return GPUS.get(_GPU_ALIASES.get(spaced, spaced))
