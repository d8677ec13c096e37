"""How long the planner takes on a large mixed cluster (target: under 1 s).

Generates a 1,000-node inventory of four GPU types (8 x H100, 8 x A800,
4 x L40S, 8 x L20) and plans three models on it: one that fits a GPU
(replicas), one that needs a node (TP), one that needs several (PP / mixed).
Prints the wall time of each plan and of building the JSON.

    python tests/bench/plan_speed.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_fleet.model.spec import load_model
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

TYPES = [("H100-SXM", 8), ("A800", 8), ("L40S", 4), ("L20", 8)]


def generate(nodes: int) -> list[dict[str, object]]:
    return [
        {
            "name": f"node-{i:04d}",
            "gpu": TYPES[i % len(TYPES)][0],
            "gpu_count": TYPES[i % len(TYPES)][1],
            "nic_gbps": 200,
            "address": f"10.{i // 250}.{i % 250}.1",
            "interface": "eth0",
        }
        for i in range(nodes)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args(argv)
    cluster = cluster_from_data({"nodes": generate(args.nodes)})
    print(f"cluster: {args.nodes} nodes, {sum(n.gpu_count for n in cluster)} GPUs, {len(TYPES)} GPU types")
    worst = 0.0
    for model, mml in (
        ("Qwen/Qwen3-8B", 32768),
        ("meta-llama/Llama-3.1-70B", 32768),
        ("deepseek-ai/DeepSeek-R1", 32768),
    ):
        spec = load_model(model)
        start = time.perf_counter()
        plan = plan_cluster(spec, cluster, Wishes(max_model_len=mml))
        planned = time.perf_counter() - start
        text = json.dumps(plan)
        total = time.perf_counter() - start
        worst = max(worst, total)
        print(
            f"{model:28} {plan['strategy']:9} {len(plan['instances']):5} instances  "
            f"plan {planned * 1000:7.1f} ms  +json {total * 1000:7.1f} ms  ({len(text) / 1e6:.1f} MB)"
        )
    print(f"worst: {worst * 1000:.1f} ms (target < 1000 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
