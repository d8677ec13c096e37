"""Day 2: ``status`` (each instance's /health and /metrics, read with ``metrics``), ``preview``
(what applying a plan changes), ``doctor`` (the node checks) and ``nccl`` (NCCL's transports)."""
