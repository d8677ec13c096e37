#!/usr/bin/env python3
"""Start one vllm-router (the vLLM project's router) for llm_gateway, with the replicas'
API key read from a file instead of its command line.

    router_launch.py --config router-N.json

router-N.json: {"argv": [vllm-router's options...], "api_key_file": PATH or ""}.

vllm-router's own ``--api-key`` is the key it sends to the workers (vLLM checks it on the
calls the router makes itself: the cache-aware policy's /v1/completions/render); a
client's own Authorization header is passed through as it came. On the command line the
key would be readable by every user in /proc/PID/cmdline and in `ps`, so this launcher
parses the options with vllm-router's own parser, sets the key from the 0600 file that
only root reads, and starts the router in this process. Runs in the router's venv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    # vllm-router's package: only in the router's venv (the role starts this with its python).
    from vllm_router.launch_router import launch_router, parse_router_args

    router_args = parse_router_args([str(a) for a in config["argv"]])
    key_file = str(config.get("api_key_file") or "")
    if key_file:
        router_args.api_key = Path(key_file).read_text().strip() or None
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
