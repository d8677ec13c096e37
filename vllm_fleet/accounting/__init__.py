"""Memory by part, the way vLLM accounts for it at startup (vllm_fleet/memory.py puts the
parts together per rank): the shared vocabulary (base) and the bytes per layer (parts)."""
