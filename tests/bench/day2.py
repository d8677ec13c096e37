"""Day-2 figures on the test hosts (root; `make up` hosts or fresh ones), from one run of
the two-replica deployment of tests/system/test_serve_on_hosts.py (nginx gateway and
Prometheus on node3):

* a rolling update under streamed load: its length, requests, failed requests, p50/p99;
* a hung replica (SIGSTOP under load): seconds until the gateway ejects it and until it
  is back in rotation (node watchdog restart + vLLM start), failed requests;
* Prometheus's scrape duration per job.

    python tests/bench/day2.py

The system test asserts the behaviour (zero failed requests during the rolling update,
ejection within 20 s, the alert firing); this prints its figures as one table. About 10 min.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="vllm-fleet-day2-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp}",
             "tests/system/test_serve_on_hosts.py"],
            cwd=ROOT, env=dict(os.environ), check=False,
        )  # fmt: skip
        found = sorted(Path(tmp).rglob("day2.json"))
        if done.returncode != 0 or not found:
            print("the day-2 run failed; its output is above", file=sys.stderr)
            return 1
        figures = json.loads(found[0].read_text())
    roll, hung = figures["rolling_update_load"], figures["hung_replica"]
    rows = [
        ("rolling update (2 replicas)", f"{figures['rolling_update_s']} s"),
        ("  requests / failed", f"{roll['requests']} / {roll['failed']}"),
        ("  latency p50 / p99", f"{roll['p50_s']} s / {roll['p99_s']} s"),
        ("hung replica: ejected after", f"{hung['ejected_s']} s"),
        ("hung replica: back in rotation after", f"{hung['recovered_s']} s"),
        ("  requests / failed", f"{hung['requests']} / {hung['failed']}"),
        *((f"scrape duration, job {job}", f"{sec * 1000:.1f} ms") for job, sec in figures["scrape_duration_s"].items()),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
