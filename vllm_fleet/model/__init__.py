"""What the planner reads of a model (vllm_fleet/model_spec.py builds the ModelSpec from it):
``values`` (bounded, typed config values), ``files`` (weights and safetensors headers),
``families`` (hybrid layer types, Llama 4), ``quantization`` (as vLLM resolves it)."""
