"""Prefix-aware routing, measured on this machine: two real vLLM CPU replicas of the tiny
model, a workload of many requests that share long prefixes (several distinct prefixes,
interleaved), sent through the llm_gateway role's nginx (least_conn, tests/gateway_local.py),
vllm-router ``--policy cache_aware`` and vllm-router ``--policy consistent_hash`` (keyed on the
``x-session-id`` header the clients send, one session per prefix), each --repeat times (3) with
prefixes of its own, so the noise between repetitions shows beside the differences.
For each it prints vLLM's own prefix-cache hit rate (the replicas' ``vllm:prefix_cache_hits_total``
over ``vllm:prefix_cache_queries_total``, in tokens, for that phase only) beside the ceiling the
trace allows (every prefix on one replica: only its first request misses), the median and p90
time to first token, completed requests per second and the failed requests. Then a run
through cache_aware where one replica is killed a third of the way in: how many requests
still succeed (its retries and health checks). Last, what each gateway adds to a short
request, side by side with the replica itself.

Each phase uses prefixes of its own (no phase finds another's blocks cached), and each
replica's KV cache holds three quarters of a phase's prefixes: a router that sends each
prefix to one replica keeps its half cached; least_conn sends every prefix to both, and they
evict each other's blocks. The killed replica's phase counts the hit rate on the replica left.

    python tests/bench/prefix_routing.py [--prefixes 8] [--requests 96] [--concurrency 4] [--repeat 3]

Needs: vLLM's CPU build (the local default's venv, /opt/vllm-fleet/vllm, else the oracle
venv from the hosts' wheels), nginx, and PyPI for vllm-router's venv (built once, cached).
Takes about 3 minutes on our 2-core machines once the venvs exist (the phases are seconds each;
starting the replicas and building the tiny model are most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import gateway_local
from tests.conftest import ROOT
from tests.hosts import images
from tests.hosts.common import run, say
from vllm_fleet.ops import metrics

MODEL_NAME = "tiny-llama"
LOCAL_VLLM = Path("/opt/vllm-fleet/vllm/bin/python")
# The tiny Llama: 4 layers x 2 KV heads x 32 dims x (K and V) x 2 bytes = 1 KiB per token.
KV_BYTES_PER_TOKEN = 1024
WORDS = [
    "river", "stone", "lamp", "orbit", "cedar", "violet", "harbor", "meadow", "signal", "copper", "lantern",
    "canyon", "ember", "falcon", "glacier", "hollow", "island", "juniper", "kettle", "ladder", "marble", "nectar",
    "oyster", "pepper", "quartz", "ribbon", "saddle", "timber", "umbra", "velvet", "willow", "yonder", "zephyr",
]  # fmt: skip


def vllm_python() -> Path:
    return LOCAL_VLLM if LOCAL_VLLM.exists() else images.oracle_venv() / "bin" / "python"


def build_model(python: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "inventories/local/files/tiny-llama/config.json", folder / "config.json")
    run([str(python), str(ROOT / "roles/vllm_server/files/build_tiny_model.py"), str(folder)], timeout=600)
    return folder


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def _wait(url: str, what: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            _get(url, timeout=2)
            say(f"{what}: up after {time.monotonic() - start:.0f} s")
            return
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    raise RuntimeError(f"{what}: no answer at {url} after {timeout:.0f} s")


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def replicas(python: Path, model: Path, tmp: Path, kv_tokens: int) -> Iterator[list[Replica]]:
    """Two vLLM CPU replicas on loopback, one core each (the last core shared when there is one)."""
    # vLLM's CPU attention uses AMX without asking Linux for it (vllm_server's vllm_fleet_amx.py):
    # every process of these replicas asks at start, as the role's venv does.
    site = tmp / "site"
    site.mkdir()
    shutil.copy(ROOT / "roles/vllm_server/files/vllm_fleet_amx.py", site / "sitecustomize.py")
    cores = os.cpu_count() or 1
    started: list[Replica] = []
    try:
        for i in range(2):
            port = gateway_local.free_port()
            env = dict(
                os.environ,
                VLLM_TARGET_DEVICE="cpu",
                VLLM_CPU_OMP_THREADS_BIND=str(i % cores),
                PYTHONPATH=str(site),
                VLLM_LOGGING_LEVEL="WARNING",
            )
            argv = [str(python.parent / "vllm"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                    "--served-model-name", MODEL_NAME, "--max-model-len", "2048", "--max-num-seqs", "4",
                    "--kv-cache-memory-bytes", str(kv_tokens * KV_BYTES_PER_TOKEN), "--enforce-eager",
                    # vllm-router's cache_aware renders each prompt on the replicas first
                    # (/v1/completions/render), which vLLM 0.32 refuses (403) without it.
                    "--enable-scale-out"]  # fmt: skip
            log = (tmp / f"replica-{i}.log").open("wb")
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            started.append(Replica(proc, port))
        for i, r in enumerate(started):
            _wait(r.url + "/health", f"replica {i} (port {r.port}, log {tmp}/replica-{i}.log)", 600, r.proc)
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(r.proc.pid, signal.SIGKILL)


ROUTER_METRICS: dict[str, int] = {}


def router_decisions() -> dict[str, float]:
    """cache_aware's routing decisions so far, by outcome (prefix_hit, prefix_miss, missing_tokens,
    load_imbalance), from the router's own /metrics."""
    port = ROUTER_METRICS.get("port")
    if not port:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm_router_prefix_routing_decisions_total{"):
            outcome = re.search(r'outcome="([^"]+)"', line)
            if outcome:
                out[outcome.group(1)] = out.get(outcome.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@contextmanager
def router(upstreams: list[str], tmp: Path, policy: str = "cache_aware") -> Iterator[str]:
    venv = images.router_venv()
    port = gateway_local.free_port()
    metrics_port = gateway_local.free_port()
    if policy == "cache_aware":
        ROUTER_METRICS["port"] = metrics_port
    argv = [str(venv / "bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *upstreams,
            "--policy", policy, "--health-check-interval-secs", "2", "--health-failure-threshold", "2",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--log-level", "warning"]  # fmt: skip
    log = (tmp / f"router-{policy}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/health", f"vllm-router {policy}", 120, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def prefixes(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Document {seed}-{p}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for p in range(count)]


def _stream(url: str, prompt: str, session: str | None = None) -> float:
    """Time to the first generated token of one streamed completion (s); raises on failure.
    ``session``: sent as ``x-session-id``, the header vllm-router's consistent_hash keys on."""
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "stream": True}).encode()
    headers = {"Content-Type": "application/json", **({"x-session-id": session} if session else {})}
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(request, timeout=120) as resp:
        for line in resp:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic() - start
            if line.strip() == b"data: [DONE]":
                break
        else:
            raise RuntimeError("the stream ended without [DONE]")
    if first is None:
        raise RuntimeError("no token came back")
    return first


def _cache_counters(urls: list[str]) -> dict[str, tuple[float, float]]:
    """Each answering replica's (prefix-cache hits, queries), in tokens, since it started."""
    out = {}
    for url in urls:
        try:
            exp = metrics.parse(_get(url + "/metrics").decode())
        except (urllib.error.URLError, OSError):
            continue  # a replica this phase killed
        hits = metrics.total(exp, "vllm:prefix_cache_hits_total") or 0.0
        out[url] = (hits, metrics.total(exp, "vllm:prefix_cache_queries_total") or 0.0)
    return out


SYSTEM = "You are a careful assistant. " + " ".join(random.Random(0).choice(WORDS) for _ in range(120))


def _prompts(docs: list[str], order: list[int], workload: str) -> list[str]:
    """``prefixes``: each request is its prefix and a question of its own. ``sessions``: a
    system prompt every session shares, the session's document, then the conversation so far,
    one turn longer with each request of that session (multi-turn chat)."""
    if workload == "prefixes":
        return [f"{docs[p]}\nQuestion {i}: what comes next?" for i, p in enumerate(order)]
    turns: dict[int, int] = {}
    out = []
    for p in order:
        t = turns.get(p, 0)
        turns[p] = t + 1
        history = "".join(f"\nUser: question {j} about it?\nAssistant: answer {j}." for j in range(t))
        out.append(f"{SYSTEM}\n{docs[p]}{history}\nUser: question {t} about it?")
    return out


def phase(
    name: str, url: str, replica_urls: list[str], docs: list[str], requests: int, concurrency: int,
    kill: subprocess.Popen[bytes] | None = None, workload: str = "prefixes",
) -> dict[str, Any]:  # fmt: skip
    """``requests`` completions, the prefixes (or sessions) interleaved in a shuffled order, from
    ``concurrency`` clients; ``kill``: this replica's process group is killed a third of the way in."""
    # Every prefix as often, in a shuffled order: a fixed p0, p1, ... cycle would let least_conn's
    # alternation send each prefix to the same replica by accident.
    order = [i % len(docs) for i in range(requests)]
    random.Random(requests).shuffle(order)
    prompts = _prompts(docs, order, workload)
    before = _cache_counters(replica_urls)
    ttft: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    cursor = iter(range(requests))

    def client() -> None:
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            if kill is not None and i == requests // 3 and kill.poll() is None:
                os.killpg(kill.pid, signal.SIGKILL)
            try:
                t = _stream(url, prompts[i], f"prefix-{order[i]}")
                with lock:
                    ttft.append(t)
            except (urllib.error.URLError, OSError, RuntimeError) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")

    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    after = _cache_counters(replica_urls)
    # Over the replicas that answer before and after (a killed one's counters are gone with it).
    both = [u for u in after if u in before]
    hits = sum(after[u][0] - before[u][0] for u in both)
    queries = sum(after[u][1] - before[u][1] for u in both)
    ttft.sort()
    return {
        "route": name,
        "requests": requests,
        "failed": len(failures),
        "hit_rate": hits / queries if queries else None,
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1) if ttft else None,
        "ttft_p90_ms": round(ttft[int(len(ttft) * 0.9)] * 1000, 1) if ttft else None,
        "seconds": round(took, 1),
        "throughput": round((requests - len(failures)) / took, 2) if took else None,
        # Every prefix on one replica: its first request misses, every later one finds it.
        "ceiling": (requests - len(docs)) / requests,
        "first_failures": failures[:3],
    }


def _spread(values: list[Any], pct: bool) -> str:
    """mean (min-max) of one figure over the repetitions, '-' where none was measured."""
    got = [float(v) for v in values if v is not None]
    if not got:
        return "-"

    def show(v: float) -> str:
        return f"{v:.1%}" if pct else f"{v:g}"

    return f"{show(statistics.mean(got))} ({show(min(got))}-{show(max(got))})"


def added_latency(urls: dict[str, str], count: int) -> dict[str, float]:
    """p50 of a short non-streamed completion (max_tokens 1) on each path, one at a time, interleaved."""
    body = json.dumps({"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1}).encode()
    times: dict[str, list[float]] = {k: [] for k in urls}
    for _ in range(count):
        for name, url in urls.items():
            request = urllib.request.Request(
                url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            start = time.monotonic()
            _get_request(request)
            times[name].append(time.monotonic() - start)
    return {name: round(statistics.median(t) * 1000, 2) for name, t in times.items()}


def _get_request(request: urllib.request.Request) -> None:
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefixes", type=int, default=8, help="distinct prefixes per phase")
    parser.add_argument("--words", type=int, default=350, help="words per prefix (about 2 tokens each)")
    parser.add_argument("--requests", type=int, default=96, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workload", choices=("prefixes", "sessions"), default="prefixes",
                        help="prefixes: shared documents, a question each; sessions: multi-turn chats that share a "
                        "system prompt, each prompt one turn longer")  # fmt: skip
    parser.add_argument("--kv-prefixes", type=float, default=0.0,
                        help="each replica's KV cache in prefixes (default: three quarters of --prefixes); "
                        "e.g. --prefixes 24 --kv-prefixes 6: a working set 4 times one replica's pool")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of every route, so the noise shows")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    if gateway_local.NGINX is None:
        print("nginx is not installed (apt-get install nginx)", file=sys.stderr)
        return 2
    python = vllm_python()
    with tempfile.TemporaryDirectory(prefix="prefix-routing-") as name:
        tmp = Path(name)
        model = build_model(python, tmp / "tiny-llama")
        sample = prefixes(1, args.words, 1)[0]
        # One prefix's tokens, with the tokenizer the replicas serve with.
        count = "import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        count += "print(len(t(sys.argv[2])['input_ids']))"
        tokens = int(run([str(python), "-c", count, str(model), sample], timeout=300).stdout.strip().splitlines()[-1])
        # Each replica holds three quarters of a phase's prefixes (and at least one whole request):
        # half of them each, as a prefix-aware router sends them, fit with room to run requests;
        # all of them, as least_conn sends them, do not.
        kv_tokens = max(
            2048 + 64, int(tokens * args.kv_prefixes) if args.kv_prefixes else tokens * args.prefixes * 3 // 4
        )
        say(f"a prefix is {tokens} tokens; {args.prefixes} per phase; KV cache per replica {kv_tokens} tokens")
        routes = ("nginx least_conn", "vllm-router cache_aware", "vllm-router consistent_hash")
        with replicas(python, model, tmp, kv_tokens) as reps:
            urls = [r.url for r in reps]
            for url in urls:  # warm-up: the first request of a replica pays its one-off costs
                _stream(url, "warm up")
            results = []
            gw_dir = tmp / "nginx"
            gw_dir.mkdir()
            with gateway_local.gateway(gw_dir, {MODEL_NAME: [u.removeprefix("http://") for u in urls]},
                                       route_by_model=False) as gw, router(urls, tmp) as rt, \
                    router(urls, tmp, "consistent_hash") as ch:  # fmt: skip
                entry = dict(zip(routes, (gw["url"], rt, ch), strict=True))
                decisions: dict[str, float] = {}
                # Each repetition and route has prefixes of its own (seeded), so no phase finds
                # another's blocks cached; the routes take turns within a repetition.
                for rep in range(args.repeat):
                    for k, route in enumerate(routes):
                        docs = prefixes(args.prefixes, args.words, 10 + rep * len(routes) + k)
                        before = router_decisions() if "cache_aware" in route else {}
                        result = phase(route, entry[route], urls, docs, args.requests, args.concurrency,
                                       workload=args.workload)  # fmt: skip
                        result["repetition"] = rep + 1
                        results.append(result)
                        say(f"{route}, repetition {rep + 1}: hit rate {result['hit_rate']}, "
                            f"TTFT p90 {result['ttft_p90_ms']} ms, failed {result['failed']}")  # fmt: skip
                        if "cache_aware" in route:
                            for outcome, n in router_decisions().items():
                                decisions[outcome] = decisions.get(outcome, 0.0) + n - before.get(outcome, 0.0)
                latency = added_latency({"replica": urls[0], "nginx": gw["url"], "vllm-router": rt}, 40)
                killed = phase("vllm-router cache_aware, replica 2 killed", rt, urls, prefixes(args.prefixes,
                               args.words, 3), args.requests, args.concurrency, kill=reps[1].proc,
                               workload=args.workload)  # fmt: skip
    print(f"\nprefix-aware routing: 2 vLLM CPU replicas of {MODEL_NAME}, {args.prefixes} prefixes of {tokens} "
          f"tokens per phase, {args.requests} requests, {args.concurrency} clients, "
          f"KV {kv_tokens} tokens/replica ({kv_tokens / tokens:.1f} prefixes), workload {args.workload}, "
          f"{args.repeat} repetitions\n")  # fmt: skip
    header = (f"{'route':32} {'rep':>3} {'failed':>6} {'hit rate':>8} {'ceiling':>8} {'TTFT p50':>9} {'TTFT p90':>9} "
              f"{'req/s':>6}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in [*results, killed]:
        hit = f"{r['hit_rate']:.1%}" if r["hit_rate"] is not None else "-"
        print(f"{r['route']:32} {r.get('repetition', '-')!s:>3} {r['failed']:>6} {hit:>8} {r['ceiling']:>8.1%} "
              f"{r['ttft_p50_ms']!s:>7}ms {r['ttft_p90_ms']!s:>7}ms {r['throughput']!s:>6}")  # fmt: skip
    print(f"\nper route over the {args.repeat} repetitions: mean (min-max)")
    for route in routes:
        mine = [r for r in results if r["route"] == route]
        print(f"  {route:32} " + "  ".join(f"{key} {_spread([r[key] for r in mine], pct)}" for key, pct in (
            ("hit_rate", True), ("ttft_p50_ms", False), ("ttft_p90_ms", False), ("throughput", False),
            ("failed", False))))  # fmt: skip
    base = latency["replica"]
    print(f"\nshort request, p50 of 40: replica {base} ms, nginx +{latency['nginx'] - base:.2f} ms, "
          f"vllm-router +{latency['vllm-router'] - base:.2f} ms")  # fmt: skip
    print(f"vllm-router cache_aware decisions in its phases (its /metrics): {decisions or 'none recorded'}")
    for r in [*results, killed]:
        if r["first_failures"]:
            print(f"{r['route']}: first failures {r['first_failures']}")
    if args.json:
        print(json.dumps({"phases": [*results, killed], "latency_ms": latency, "prefix_tokens": tokens,
                          "kv_tokens": kv_tokens}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
