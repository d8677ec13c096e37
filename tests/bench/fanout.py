"""The controller at fleet size: what each fork and each host cost it (issue: the plan phase at
fleet scale, "controller sizing documented from measurements").

Runs tests/bench/fanout.yml (the gpu_facts role: the read-only probe every phase starts with,
two commands and a parse per host, over SSH) against N inventory names spread over the test
hosts (``python -m tests.hosts up``; each name is one more SSH target for the controller, though
three machines answer), once per --forks value, and prints per run: the wall time, the
controller's CPU time (ansible-playbook, its forks and their ssh clients) and its peak memory
as the sum of the process tree's PSS (shared pages counted once), per fork and per host.
Prints figures, asserts nothing.

    python tests/bench/fanout.py [--hosts 60] [--forks 5,20,50]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTS = Path("/var/tmp/vllm-fleet-test/hosts/inventory.yml")


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(inventory: Path, forks: int) -> dict[str, float]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(BIN / "ansible-playbook"), "tests/bench/fanout.yml", "-i", str(inventory), "-f", str(forks)]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"kib": 0, "procs": 0}

    def sample() -> None:
        while proc.poll() is None:
            pids = _tree(proc.pid)
            total = sum(_pss_kib(p) for p in pids)
            if total > peak["kib"]:
                peak["kib"], peak["procs"] = total, len(pids)
            time.sleep(0.25)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, _ = proc.communicate()
    watcher.join()
    seconds, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"fanout.yml with forks={forks} failed (rc {proc.returncode}):\n{out[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu": cpu, "pss_mib": peak["kib"] / 1024, "procs": peak["procs"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=60, help="inventory names (spread over the test hosts)")
    parser.add_argument("--forks", default="5,20,50", help="comma-separated forks values")
    args = parser.parse_args()
    if not HOSTS.is_file():
        sys.exit(f"{HOSTS} is missing: start the test hosts first (python -m tests.hosts up)")
    real = yaml.safe_load(HOSTS.read_text())["all"]
    machines = real["children"]["test_hosts"]["hosts"]
    names = sorted(machines)
    fleet = {
        f"fan-{i:04d}": {"ansible_host": machines[names[i % len(names)]]["ansible_host"]} for i in range(args.hosts)
    }
    data = {"all": {"children": {"fanout": {"hosts": fleet}}, "vars": real["vars"]}}
    print(f"gpu_facts over SSH on {args.hosts} inventory names ({len(names)} machines answer), "
          f"{os.cpu_count()} controller cores")  # fmt: skip
    print(f"{'forks':>5} {'wall':>8} {'ctl CPU':>8} {'CPU/host':>9} {'peak PSS':>9} {'PSS/fork':>9} {'procs':>6}")
    with tempfile.TemporaryDirectory(prefix="vf-fanout-") as tmp:
        inventory = Path(tmp) / "hosts.json"
        inventory.write_text(json.dumps(data))
        base = None
        for forks in [int(f) for f in args.forks.split(",")]:
            got = run(inventory, forks)
            base = base if base is not None else got
            per_fork = (got["pss_mib"] - base["pss_mib"]) / max(forks - 5, 1) if forks > 5 else float("nan")
            print(
                f"{forks:>5} {got['seconds']:>7.1f}s {got['cpu']:>7.1f}s {got['cpu'] / args.hosts:>8.2f}s "
                f"{got['pss_mib']:>6.0f} MiB {per_fork:>6.1f} MiB {got['procs']:>6}"
            )
    print("PSS/fork: the peak's growth per fork over the run with 5 forks (each fork runs one host's task).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
