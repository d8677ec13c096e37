"""Config.json values of the models operators deploy in 2026, each with where it was read.

Every dict is the model's public config.json as a copy of it that could be read offline holds it
(vendored in another repository, quoted in a test, printed in a log); the comment above each names the
copy and says which values were not verified from it. ``catalog.MODELS`` merges them in.

AIC below is ai-dynamo/aiconfigurator's aic-core/src/aiconfigurator_core/model_configs (snapshot of
2026-08-21, commit 095f58a5; the files last changed in commit 0b077da5).
"""

from __future__ import annotations

from typing import Any

# Qwen/Qwen3-Next-80B-A3B-Thinking: config.json as vendored in ai-dynamo/aiconfigurator
# src/aiconfigurator/model_configs/Qwen--Qwen3-Next-80B-A3B-Thinking_config.json (commit 1b7cfb10). Gated
# DeltaNet + gated attention every 4th layer (full_attention_interval; no layer_types in the file),
# 512 experts top-10 plus one shared expert. The Instruct release shares it: the copy of the Instruct's
# config read (a Chinese code-reading note, find_string id 11506512146) holds the same keys and values
# except num_hidden_layers/vocab_size/bos/eos, which that note shrank -- so the Instruct name is an
# alias here, not separately verified for those four keys.
_QWEN3_NEXT_80B: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen/Qwen3-VL-8B-Instruct: config.json as vendored in AIC/Qwen--Qwen3-VL-8B-Instruct_config.json (commit 0b077da5).
# That copy leaves out text_config.rope_scaling; the interleaved MRoPE below ({mrope_interleaved: true, mrope_section:
# [24, 20, 20]}) is from the Qwen3-VL-4B-Instruct config.json copied in full into a kohya-style loader (find_string id
# 60285814056) and the Cosmos3 test that states its Nano reasoner equals Qwen3-VL-8B (find_string id 56602326321): not
# read in a copy of the 8B's own file.
_QWEN3_VL_8B: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": False,
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_vl",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}

# Qwen/Qwen3-VL-30B-A3B-Instruct: config.json as vendored in AIC/Qwen--Qwen3-VL-30B-A3B-Instruct_config.json (commit
# 0b077da5). That copy has no text_config.rope_scaling (the hub file's MRoPE section is not verified, so it is left
# out: it does not change memory).
_QWEN3_VL_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl_moe",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "model_type": "qwen3_vl_moe_text",
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": False,
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_vl_moe",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}

# Qwen/Qwen3-VL-235B-A22B-Instruct: config.json as vendored in AIC/Qwen--Qwen3-VL-235B-A22B-Instruct_config.json
# (commit 0b077da5); rope_scaling absent there as above.
_QWEN3_VL_235B_A22B: dict[str, Any] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl_moe",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "model_type": "qwen3_vl_moe_text",
        "moe_intermediate_size": 1536,
        "norm_topk_prob": True,
        "num_attention_heads": 64,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 94,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "tie_word_embeddings": False,
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_vl_moe",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}

# Qwen/Qwen2.5-VL-7B-Instruct: config.json as quoted in kohya-ss/sd-scripts
# library/hunyuan_image_text_encoder.py (QWEN2_5_VL_CONFIG_JSON, a transformers 4.53 re-save of the hub
# file). The flat top-level keys and vision_config are kept; the text_config that the re-save adds is left
# out (the hub file is flat, as vLLM's Qwen2_5_VLConfig reads it either way). Qwen2.5-VL-72B: no copy of its
# config.json was found, so it is not in the catalog.
_QWEN2_5_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "image_token_id": 151655,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "hidden_act": "silu",
        "hidden_size": 1280,
        "in_channels": 3,
        "in_chans": 3,
        "initializer_range": 0.02,
        "intermediate_size": 3420,
        "model_type": "qwen2_5_vl",
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "tokens_per_second": 2,
        "window_size": 112,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
    "vision_token_id": 151654,
    "vocab_size": 152064,
}

# deepseek-ai/DeepSeek-V3.1: the architecture keys are those of nvidia/DeepSeek-V3.1-NVFP4's config.json as
# vendored in ai-dynamo/aiconfigurator aic-core/src/aiconfigurator_core/model_configs/
# nvidia--DeepSeek-V3.1-NVFP4_config.json (NVIDIA's quantization of V3.1 keeps DeepSeek's config.json and
# moves the quantization to hf_quant_config.json). The official checkpoint's quantization_config is NOT
# verified from a copy of V3.1's own file: the fp8 e4m3 128x128-block dict of DeepSeek-V3's vendored
# config.json (same repository, deepseek-ai--DeepSeek-V3_config.json) is used; V3.2's adds
# scale_fmt "ue8m0", which V3.1's may have too.
_DEEPSEEK_V3_1: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.44.2",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# deepseek-ai/DeepSeek-V3.2: config.json as vendored in AIC/deepseek-ai--DeepSeek-V3.2_config.json (commit 0b077da5):
# MLA plus the DSA lightning indexer (index_n_heads/index_head_dim/index_topk), fp8 e4m3 128x128 blocks with ue8m0
# scales. DeepSeek-V3.2-Exp is an alias of it: V3.2-Exp's own config.json was not read (same DeepseekV32ForCausalLM
# architecture and sizes per DeepSeek's release notes), so that alias is not verified key by key.
_DEEPSEEK_V3_2: dict[str, Any] = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_topk": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v32",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.44.2",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# moonshotai/Kimi-K2-Instruct: config.json as vendored in AIC/moonshotai--Kimi-K2-Instruct_config.json (commit
# 0b077da5), auto_map left out: DeepSeek-V3's MLA with 64 heads, 384 experts, one dense layer, fp8 e4m3 128x128
# blocks, no MTP layer.
_KIMI_K2: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 131072,
    "model_type": "kimi_k2",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.827,
    "rope_scaling": {
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.48.3",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 163840,
}

# zai-org/GLM-4.5-Air: the Glm4MoeConfig that ms-swift printed on loading it (a swift run log, find_string id
# 48221590695; transformers_version 4.54.1): every key of the hub's config.json as transformers read it.
# GLM-4.5 (355B) and GLM-4.6: no copy of their config.json was found, so they are not in the catalog.
_GLM_4_5_AIR: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338],
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "max_position_embeddings": 131072,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 46,
    "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1,
    "pad_token_id": 151329,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": False,
    "vocab_size": 151552,
}

# meta-llama/Llama-4-Scout-17B-16E-Instruct: config.json as vendored in
# AIC/meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json (commit 0b077da5). That copy has no vision_config; the
# one below is what a test of a vendored Llama-4 checkpoint config asserts (find_string id 68383952491, repository not
# shown by the index; the same dict for Scout and Maverick). Not verified: the text_config keys that copy may have
# dropped (no_rope_layers, attn_temperature_tuning, floor_scale, attn_scale).
_LLAMA4_SCOUT: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "text_config": {
        "attention_bias": False,
        "attention_chunk_size": 8192,
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "interleave_moe_layer_step": 1,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "max_position_embeddings": 10485760,
        "model_type": "llama4_text",
        "num_attention_heads": 40,
        "num_experts_per_tok": 1,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "num_local_experts": 16,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 16.0,
            "high_freq_factor": 1.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "router_aux_loss_coef": 0.001,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_qk_norm": True,
        "vocab_size": 202048,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
}

# meta-llama/Llama-4-Maverick-17B-128E-Instruct: config.json as vendored in
# AIC/meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json (commit 0b077da5), vision_config as for Scout. MoE
# every second layer (interleave_moe_layer_step 2); the dense layers use intermediate_size_mlp.
_LLAMA4_MAVERICK: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "text_config": {
        "attention_bias": False,
        "attention_chunk_size": 8192,
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "interleave_moe_layer_step": 2,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "max_position_embeddings": 1048576,
        "model_type": "llama4_text",
        "num_attention_heads": 40,
        "num_experts_per_tok": 1,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "num_local_experts": 128,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "router_aux_loss_coef": 0.001,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_qk_norm": False,
        "vocab_size": 202048,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
}

# mistralai/Mistral-Small-3.1-24B-Instruct-2503: config.json as quoted in NVIDIA/TensorRT-LLM
# tests/unittest/_torch/modeling/test_modeling_mistral.py (mistral_small_3_1_24b_config; the fixture cuts
# num_hidden_layers to 4 and says the original is 40, which is used here; patch_size = its _PATCH_SIZE, 14).
# Mistral-Small-3.2-24B-Instruct-2506: no copy of its config.json was read, so it is not in the catalog.
_MISTRAL_SMALL_3_1: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 10,
    "model_type": "mistral3",
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "text_config": {
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "use_cache": True,
        "vocab_size": 131072,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "attention_dropout": 0.0,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "rope_theta": 10000.0,
    },
    "vision_feature_layer": -1,
}

# nvidia/Nemotron-H-56B-Base-8K: config.json as vendored in AIC/nvidia--Nemotron-H-56B-Base-8K_config.json (commit
# 0b077da5); auto_map and time_step_limit ([0.0, Infinity], not JSON) left out. Mamba-2 (M), attention (*) and MLP (-)
# blocks per hybrid_override_pattern. NVIDIA-Nemotron-Nano-9B-v2 / Nemotron-H-8B: only partial copies of their
# config.json were found.
_NEMOTRON_H_56B: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_head_dim": 128,
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "eos_token_id": 2,
    "expand": 2,
    "hidden_dropout": 0.0,
    "hidden_size": 8192,
    "hybrid_override_pattern": (
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-"
        "M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    ),
    "initializer_range": 0.02,
    "intermediate_size": 32768,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 256,
    "mamba_proj_bias": False,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h",
    "n_groups": 8,
    "num_attention_heads": 64,
    "num_hidden_layers": 118,
    "num_key_value_heads": 8,
    "num_logits_to_keep": 1,
    "pad_token_id": 0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "rms_norm_eps": 1e-05,
    "sliding_window": None,
    "ssm_state_size": 256,
    "tie_word_embeddings": False,
    "time_step_floor": 0.0001,
    "time_step_max": 0.1,
    "time_step_min": 0.001,
    "time_step_rank": 512,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.48.0.dev0",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 131072,
}

# Not in the copies read (see the comments above): marked where they are added.
_DEEPSEEK_V3_1["quantization_config"] = {  # DeepSeek-V3's, not verified for V3.1
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
_QWEN3_VL_8B["text_config"]["rope_scaling"] = {  # from the Qwen3-VL-4B / Cosmos3 copies, see above
    "mrope_interleaved": True,
    "mrope_section": [24, 20, 20],
    "rope_type": "default",
}
_LLAMA4_VISION: dict[str, Any] = {  # find_string id 68383952491, see the Scout comment
    "attention_dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_size": 1408,
    "image_size": 336,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "model_type": "llama4_vision_model",
    "multi_modal_projector_bias": False,
    "norm_eps": 1e-5,
    "num_channels": 3,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "projector_dropout": 0.0,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "rope_theta": 10000,
    "torch_dtype": "bfloat16",
    "vision_feature_layer": -1,
    "vision_feature_select_strategy": "default",
    "vision_output_dim": 4096,
}
_LLAMA4_SCOUT["vision_config"] = dict(_LLAMA4_VISION)
_LLAMA4_MAVERICK["vision_config"] = dict(_LLAMA4_VISION)

# google/gemma-3-4b-it: the hub's config.json names few keys (transformers' defaults fill the rest). The keys
# it names are those quoted in a .NET port's test as "the original gemma-3-4b-it's config.json" (find_string
# id 70892509106; its vision_config there too). The keys marked "default" are absent from the file: their
# values are the defaults of transformers 5.19's Gemma3TextConfig / Gemma3Config
# (transformers/models/gemma3/configuration_gemma3.py), which is what vLLM's loaded hf_config carries; they
# are written out because the planner does not know transformers' defaults. The 12B and 27B entries above are
# the older, shorter catalog form.
_GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
        "num_attention_heads": 8,  # default
        "num_key_value_heads": 4,  # default
        "head_dim": 256,  # default
        "query_pre_attn_scalar": 256,  # default
        "vocab_size": 262208,  # default
        "max_position_embeddings": 131072,  # default
    },
    "tie_word_embeddings": True,  # default (Gemma3Config)
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}

# intfloat/e5-mistral-7b-instruct: config.json as vendored in sgl-project/ome
# pkg/hfutil/modelconfig/testdata/e5_mistral_7b.json (commit 8bd1f97b); the repository's
# mistral_embedding.json copy (commit c877023b) holds the same sizes. An embedding model: vLLM runs
# "MistralModel" as a pooling model (ModelConfig._get_default_runner_type: the "Model" suffix means
# runner pooling, convert embed) on its Llama implementation with causal attention, so it keeps a KV
# cache like a decoder; the planner models it as one. No lm_head is loaded for it (the planner counts
# one: 0.24 GiB too many in float16, on the safe side).
_E5_MISTRAL_7B: dict[str, Any] = {
    "_name_or_path": "mistralai/Mistral-7B-v0.1",
    "architectures": ["MistralModel"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pad_token_id": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.34.0",
    "use_cache": False,
    "vocab_size": 32000,
}

# Catalog name -> config.json.
MODELS_2026: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-Next-80B-A3B-Thinking": _QWEN3_NEXT_80B,
    "Qwen/Qwen3-VL-8B-Instruct": _QWEN3_VL_8B,
    "Qwen/Qwen3-VL-30B-A3B-Instruct": _QWEN3_VL_30B_A3B,
    "Qwen/Qwen3-VL-235B-A22B-Instruct": _QWEN3_VL_235B_A22B,
    "Qwen/Qwen2.5-VL-7B-Instruct": _QWEN2_5_VL_7B,
    "deepseek-ai/DeepSeek-V3.1": _DEEPSEEK_V3_1,
    "deepseek-ai/DeepSeek-V3.2": _DEEPSEEK_V3_2,
    "moonshotai/Kimi-K2-Instruct": _KIMI_K2,
    "zai-org/GLM-4.5-Air": _GLM_4_5_AIR,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": _LLAMA4_SCOUT,
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": _LLAMA4_MAVERICK,
    "google/gemma-3-4b-it": _GEMMA3_4B,
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": _MISTRAL_SMALL_3_1,
    "nvidia/Nemotron-H-56B-Base-8K": _NEMOTRON_H_56B,
    "intfloat/e5-mistral-7b-instruct": _E5_MISTRAL_7B,
}

# Names for the same weights whose config.json was not read on its own (see the comments above).
ALIASES_2026: dict[str, str] = {
    "Qwen/Qwen3-Next-80B-A3B-Instruct": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    "deepseek-ai/DeepSeek-V3.2-Exp": "deepseek-ai/DeepSeek-V3.2",
}
