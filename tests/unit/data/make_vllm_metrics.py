"""Write the /metrics fixtures of test_metrics.py / test_status.py with vLLM 0.32's own code.

Not a test: run it with the vLLM venv (CPU build is enough, nothing is served):

    /opt/vllm-fleet/vllm/bin/python tests/unit/data/make_vllm_metrics.py tests/unit/data

It builds a VllmConfig for the tiny-llama inventory model, instantiates
vllm.v1.metrics.loggers.PrometheusStatLogger (the class the API server's /metrics
exposes), records scheduler/iteration stats and writes prometheus_client's
exposition of the registry vLLM serves:

- vllm_metrics_0_32.txt / vllm_metrics_0_32_later.txt: one engine, the default
  registry (so process_start_time_seconds is there), two scrapes, counters grown;
- vllm_metrics_0_32_dp2.txt: two engines (DP=2), the multiprocess registry vLLM uses
  with --api-server-count > 1 (the default under DP): no process_* metrics.
"""

import os
import sys
import tempfile
from pathlib import Path

MODEL = str(Path(__file__).resolve().parents[3] / "inventories" / "local" / "files" / "tiny-llama")
NUM_GPU_BLOCKS = 14695


def _record(prom: object, engine: int, step: dict[str, float]) -> None:
    """One scheduler + iteration update of ``engine``, as EngineCore's outputs bring them."""
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    sched = SchedulerStats(
        num_running_reqs=int(step["running"]) + engine,
        num_waiting_reqs=int(step["waiting"]),
        kv_cache_usage=step["usage"] + 0.1 * engine,
        prefix_cache_stats=PrefixCacheStats(requests=1, queries=int(step["queries"]), hits=int(step["hits"])),
    )
    it = IterationStats()
    it.prompt_token_stats.computed = int(step["prompt"]) + 10 * engine
    it.prompt_token_stats.total = int(step["prompt"]) + 10 * engine
    it.num_generation_tokens = int(step["gen"]) + 5 * engine
    it.num_preempted_reqs = int(step["preempt"])
    prom.record(sched, it, engine_idx=engine)  # type: ignore[attr-defined]


# What each scrape adds: the counters grow by these between the two scrapes.
FIRST = {
    "running": 2,
    "waiting": 1,
    "usage": 0.25,
    "queries": 1000,
    "hits": 600,
    "prompt": 400,
    "gen": 300,
    "preempt": 1,
}
SECOND = {
    "running": 5,
    "waiting": 0,
    "usage": 0.5,
    "queries": 500,
    "hits": 450,
    "prompt": 200,
    "gen": 900,
    "preempt": 0,
}


def main(out: Path, mode: str) -> None:
    if mode == "dp2":
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="vllm-fleet-prom-")
    from prometheus_client import generate_latest
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    cfg = EngineArgs(model=MODEL, served_model_name=["tiny-llama"], max_model_len=2048).create_engine_config()
    cfg.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    engines = [0, 1] if mode == "dp2" else [0]
    prom = PrometheusStatLogger(cfg, engine_indexes=engines)
    prom.log_engine_initialized()
    registry = get_prometheus_registry()
    for e in engines:
        _record(prom, e, FIRST)
    name = "vllm_metrics_0_32_dp2.txt" if mode == "dp2" else "vllm_metrics_0_32.txt"
    (out / name).write_bytes(generate_latest(registry))
    if mode == "one":
        _record(prom, 0, SECOND)
        (out / "vllm_metrics_0_32_later.txt").write_bytes(generate_latest(registry))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "one")
