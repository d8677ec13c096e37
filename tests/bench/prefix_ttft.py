"""What a prefix-cache hit saves in TTFT, measured and predicted (make bench-prefix, issue 45).

The tiny model's prefill is too cheap for a cache hit to show in TTFT. This bench builds a
larger random Llama (hidden 512, 6 layers, vocab 2,048: about 19 M parameters) whose 2,048-token
prefill costs a few hundred ms on our 2-core machine, serves it with vLLM's CPU build (prefix
caching on), and sends, one at a time: prompts of 2,048 new tokens (each its own prefix: a miss)
and prompts that repeat a 2,048-token prefix already cached with 32 new tokens after it (a hit).
It prints the median TTFT of each beside the performance model's prediction for the same request
(``prefix_hit`` 0 and 2,048 / 2,080), and the saving both ways.

    python tests/bench/prefix_ttft.py [--requests 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.prefix_routing import vllm_python
from tests.conftest import ROOT
from vllm_fleet.accounting.memory import estimate
from vllm_fleet.accounting.settings import Settings
from vllm_fleet.model.spec import load_model
from vllm_fleet.performance.predict import Placement, server_for
from vllm_fleet.performance.workload import Workload
from vllm_fleet.planning.cluster import cluster_from_data
from vllm_fleet.planning.strategy import Wishes, plan_cluster

PLAY = ROOT / "playbooks/files"
sys.path.insert(0, str(PLAY))

import verify_probe  # noqa: E402

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1536,
    "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "vocab_size": 2048, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
PREFIX, SUFFIX, PORT = 2048, 32, 8391


def _ttft(prompt: list[int]) -> float:
    body = {"model": "prefix", "prompt": prompt, "max_tokens": 1, "stream": True, "ignore_eos": True}
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            event = verify_probe.sse_event(line)
            if isinstance(event, dict) and any(c.get("text") is not None for c in event.get("choices") or []):
                return (time.monotonic() - start) * 1000
    raise RuntimeError("no token came back")


def _tokens(seed: int, count: int) -> list[int]:
    return [10 + (seed * 7919 + i * 104729) % 2000 for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args(argv)
    python = vllm_python()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "prefix"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(CONFIG))
        subprocess.run([str(python), str(ROOT / "roles/vllm_server/files/build_tiny_model.py"), str(folder)],
                       check=True, capture_output=True)  # fmt: skip
        nodes = cluster_from_data({"nodes": [{"name": "here", "gpu": "cpu", "gpu_count": 1, "gpu_memory_gib": 2,
                                              "cpu_cores": 2}]})  # fmt: skip
        spec = load_model(str(folder))
        plan = plan_cluster(spec, nodes, Wishes(max_model_len=4096, enable_prefix_caching=True))
        inst = plan["instances"][0]
        argv_ = ["serve", str(folder), "--host", "127.0.0.1", "--port", str(PORT), "--served-model-name", "prefix",
                 "--max-model-len", "4096", "--enable-prefix-caching", "--kv-cache-memory-bytes",
                 str(inst["stages"][0]["kv_cache_memory_bytes"])]  # fmt: skip
        log = open(Path(tmp) / "vllm.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([str(python.parent / "vllm"), *argv_], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)
                    break
                except OSError:
                    if proc.poll() is not None:
                        raise SystemExit(f"vLLM exited: {(Path(tmp) / 'vllm.log').read_text()[-2000:]}") from None
                    time.sleep(2)
            _ttft(_tokens(999, 64))  # warm-up
            misses = [_ttft(_tokens(i, PREFIX)) for i in range(args.requests)]
            shared = _tokens(5000, PREFIX)
            _ttft(shared + _tokens(6000, SUFFIX))  # caches the prefix
            hits = [_ttft(shared + _tokens(7000 + i, SUFFIX)) for i in range(args.requests)]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        device = nodes[0].device()
        est = estimate(spec, device, Settings(max_model_len=4096, enable_prefix_caching=True))
        est_server = server_for(spec, est, device, Placement(cpu_cores=2))
        cold = est_server.predict(Workload(PREFIX, 1, 1, concurrency=1)).ttft_ms.median
        warm = est_server.predict(
            Workload(PREFIX + SUFFIX, 1, 1, concurrency=1, prefix_hit=PREFIX / (PREFIX + SUFFIX))
        ).ttft_ms.median
    miss, hit = statistics.median(misses), statistics.median(hits)
    print(f"model: {spec.name.split('/')[-1]} (hidden 512, 6 layers), vLLM's CPU build, {args.requests} requests each")
    print(f"{'':34} {'measured':>10} {'predicted':>10}")
    print(f"{'TTFT, 2,048 new tokens (miss)':34} {miss:>8.1f} ms {cold:>8.1f} ms")
    print(f"{'TTFT, 2,048 cached + 32 new (hit)':34} {hit:>8.1f} ms {warm:>8.1f} ms")
    print(f"{'saved by the hit':34} {miss - hit:>8.1f} ms {cold - warm:>8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
