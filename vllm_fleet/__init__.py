"""vllm-fleet: plan, provision and serve LLMs with vLLM and Ray on GPU clusters."""

# The release: pyproject.toml's version, the collection's (galaxy.yml) and `vllm-fleet --version`.
__version__ = "0.1.0"
