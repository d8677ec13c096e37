"""What the planner reads of a model: ``spec`` builds the ModelSpec from a folder or the catalog;
``values`` (bounded, typed config values), ``files`` (weights and safetensors headers),
``families`` (hybrid layer types, Llama 4), ``quantization`` (as vLLM resolves it), ``length``
(the context length vLLM derives), ``catalog`` (GPUs and models by name, the 2026 configs as data)."""
