"""Memory by part, the way vLLM accounts for it at startup, and ``memory`` (``estimate``) putting
the parts together per rank. In import order:

* ``base``: vLLM releases and which accounting each uses, the profile's constants, MoE layout;
* ``parts``: each layer's weight bytes on one rank, a pipeline stage's parts, KV bytes per layer;
* ``settings``: what the planner is asked to plan with (``Settings``) and for (``Device``);
* ``refusal``: what vLLM refuses before counting memory (dtype, quantization, capability);
* ``kv``: the KV cache's layout, block and page sizes, and the tokens the pool holds;
* ``activation``: the profile pass's activations, all2all buffers, non-torch memory, CUDA graphs;
* ``towers``: multimodal towers' weights and encoder cache; ``multimodal``: their configs;
* ``options``: what LoRA, speculative decoding and CPU offload add or take;
* ``memory``: one instance's memory per GPU (``estimate``), the plan's unit of account.
"""
