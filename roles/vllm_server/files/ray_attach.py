#!/usr/bin/env python3
"""Check, in the exact environment a Ray-executor launch starts in, that vLLM's driver
will attach to the Ray cluster: run with the launch's venv Python, as the launch's user,
with the launch's environment file applied (RAY_ADDRESS, the token, VLLM_HOST_IP ...).

    ray_attach.py [--env-file F] --nodes N --gpus G

Prints one JSON line {"ok", "nodes", "gpus", "address", "ray_version", "problem"} and
exits 0 when ``ray.init(address="auto")`` connects and the cluster has at least N alive
nodes and G GPUs, else 1 with the problem named. On a GPU cluster this is the step
before vLLM creates its placement group; on a CPU build it is as far as Ray goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def read_env(path: str) -> dict[str, str]:
    """KEY=VALUE lines; a value in double quotes may escape \\, " and $ with a backslash."""
    env: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            out, chars = [], iter(value[1:-1])
            for ch in chars:
                out.append(next(chars, "") if ch == "\\" else ch)
            value = "".join(out)
        elif len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        env[key] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ray_attach.py")
    parser.add_argument("--env-file", default="", help="apply this KEY=VALUE file first")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=float, required=True)
    args = parser.parse_args(argv)
    if args.env_file:
        os.environ.update(read_env(args.env_file))
    result: dict[str, object] = {"ok": False, "address": os.environ.get("RAY_ADDRESS", "auto")}
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # Ray prints to stdout; keep it for the one JSON line
    try:
        import ray

        result["ray_version"] = ray.__version__
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        gpus = float(ray.cluster_resources().get("GPU", 0))
        result.update(nodes=len(nodes), gpus=gpus)
        missing = []
        if len(nodes) < args.nodes:
            missing.append(f"{len(nodes)} of {args.nodes} Ray nodes alive")
        if gpus < args.gpus:
            missing.append(f"{gpus:g} of {args.gpus:g} GPUs in the cluster")
        if missing:
            result["problem"] = "; ".join(missing)
        else:
            result["ok"] = True
        ray.shutdown()
    except ImportError as exc:
        result["problem"] = f"Ray cannot be imported in this environment: {exc}"
    except Exception as exc:  # anything Ray raises is the answer
        result["problem"] = f"ray.init(address='auto') failed: {type(exc).__name__}: {exc}"
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
