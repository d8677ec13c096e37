"""Time from play start to "all N nodes joined", for 2, 4 and 8 test hosts, and the idempotent re-run.

Runs the ray_cluster role (systemd runtime, logical GPUs) on fresh test hosts
(tests/hosts) and reads per-task times from ansible.posix.profile_tasks.
Needs root; starts and removes the hosts itself.

    python tests/bench/ray_join.py [--nodes 2 4 8]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.hosts import nodes  # noqa: E402

PLAYBOOK = ROOT / "tests/bench/ray_join.yml"
BIN = Path(sys.executable).parent


def play(token: Path) -> tuple[float, dict[str, float], str]:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
        ANSIBLE_NOCOLOR="1",
        PROFILE_TASKS_TASK_OUTPUT_LIMIT="100",
        VLLM_FLEET_BENCH_TOKEN=str(token),
    )
    start = time.monotonic()
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(nodes.INVENTORY), str(PLAYBOOK)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    wall = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"playbook failed:\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}")
    tasks: dict[str, float] = {}
    for name, seconds in re.findall(r"^(.+?) -{3,} (\d+\.\d+)s$", result.stdout, re.MULTILINE):
        tasks[name.strip()] = tasks.get(name.strip(), 0.0) + float(seconds)
    return wall, tasks, result.stdout


def seconds(tasks: dict[str, float], *fragments: str) -> float:
    return sum(v for k, v in tasks.items() if any(f in k for f in fragments))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    rows = []
    try:
        for count in args.nodes:
            nodes.reset(count)
            with tempfile.TemporaryDirectory() as tmp:
                token = Path(tmp) / "ray.token"
                wall, tasks, _ = play(token)
                join = seconds(tasks, "Start the head", "Start the workers", "Ask the head how many")
                install = seconds(tasks, "Install the pinned Ray", "Install the Python venv")
                again, _, out = play(token)
                recap = re.findall(r"changed=(\d+)", out.split("PLAY RECAP")[-1])
                rows.append((count, wall, install, join, again, sum(int(c) for c in recap)))
    finally:
        nodes.down()
    print(f"\n{'hosts':>5}  {'first run':>9}  {'venv install':>12}  {'start->all joined':>17}  {'re-run':>7}  changed")
    for count, wall, install, join, again, changed in rows:
        print(f"{count:>5}  {wall:8.1f}s  {install:11.1f}s  {join:16.1f}s  {again:6.1f}s  {changed}")


if __name__ == "__main__":
    main()
