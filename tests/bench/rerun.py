"""What a no-change re-run of site.yml costs against its first run (issue 17: at most 25 %).

Runs `ansible-playbook site.yml -i INVENTORY` twice, a first run and then a no-change
re-run, with Ansible's JSON stdout callback (ansible.posix.json: each task's start and
end, each host's result), and prints: both wall times and their ratio, the re-run's
changed count per host (it must be 0; the tasks that changed are named, and the exit
code is then 1), and the re-run's 15 slowest tasks with their seconds. Prints figures,
asserts no timing. Needs what site.yml needs there (root for the local default).

    python tests/bench/rerun.py [--inventory inventories/local] [--reset] [--extra-vars K=V ...]

--reset runs playbooks/teardown.yml first, so that the first run really starts vLLM
(teardown keeps the venvs, the model and the OS packages: a warm start).

It also prints the controller's CPU time for each run (ansible-playbook, its forks and its ssh
clients: what the controller pays, not the hosts) per host, and projects the re-run to
--project hosts (default 1,000) with the assumption written out: the controller's CPU grows
linearly with the hosts (each host runs the same tasks), and the hosts work in batches of
--forks (ansible.cfg's forks) whose wall time is this re-run's.
"""

from __future__ import annotations

import argparse
import configparser
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SLOWEST = 15


@dataclass
class Run:
    seconds: float
    report: dict[str, Any]
    cpu: float  # the controller's CPU seconds (user + system of ansible-playbook and its children)


@dataclass
class Task:
    name: str
    play: str
    seconds: float
    changed_on: list[str]
    ran: bool  # some host ran it (not skipped everywhere)


def playbook(name: str, inventory: str, extra_vars: list[str]) -> Run:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_JSON_INDENT="0",
    )
    argv = [str(BIN / "ansible-playbook"), name, "-i", inventory]
    for extra in extra_vars:
        argv += ["-e", extra]
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = _report(done.stdout)
    if done.returncode != 0:
        failed = [f"{t.name}: {msg}" for t, msg in _failures(report)] if report else []
        sys.exit(f"{name} failed (rc {done.returncode}):\n" + "\n".join(failed[:5]) + f"\n{done.stderr[-3000:]}")
    if report is None:
        sys.exit(f"{name}: no JSON report on stdout:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return Run(seconds, report, cpu)


def _report(stdout: str) -> dict[str, Any] | None:
    """The callback's one JSON document (anything printed before it is skipped)."""
    start = stdout.find('{"custom_stats"')
    if start < 0:
        start = stdout.find("{")
    if start < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.rstrip("Z"))


def tasks(report: dict[str, Any]) -> list[Task]:
    found = []
    for play in report.get("plays", []):
        for entry in play.get("tasks", []):
            task, hosts = entry["task"], entry.get("hosts", {})
            duration = task.get("duration", {})
            if "end" not in duration:  # no host result (an include, an empty host list)
                continue
            seconds = (_time(duration["end"]) - _time(duration["start"])).total_seconds()
            changed = sorted(h for h, r in hosts.items() if r.get("changed"))
            ran = any(not r.get("skipped") for r in hosts.values())
            found.append(Task(task["name"], play["play"]["name"], seconds, changed, ran))
    return found


def _failures(report: dict[str, Any]) -> list[tuple[Task, str]]:
    out = []
    for play in report.get("plays", []):
        for entry in play.get("tasks", []):
            for host, result in entry.get("hosts", {}).items():
                if result.get("failed") and not result.get("ignore_errors"):
                    task = Task(entry["task"]["name"], play["play"]["name"], 0.0, [], True)
                    out.append((task, f"[{host}] {str(result.get('msg', ''))[:300]}"))
    return out


def executions(report: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """Per host, per play: [tasks run, tasks skipped]. Each is one worker fork on the controller
    (a skipped task too), the unit a re-run's controller CPU grows by."""
    found: dict[str, dict[str, list[int]]] = {}
    for play in report.get("plays", []):
        for entry in play.get("tasks", []):
            for host, result in entry.get("hosts", {}).items():
                counts = found.setdefault(host, {}).setdefault(play["play"]["name"], [0, 0])
                counts[1 if result.get("skipped") else 0] += 1
    return found


def changed_counts(report: dict[str, Any]) -> dict[str, int]:
    return {host: int(stats.get("changed", 0)) for host, stats in report.get("stats", {}).items()}


def _forks() -> int:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "ansible.cfg")
    return config.getint("defaults", "forks", fallback=5)


def _project(first: Run, again: Run, hosts: int, target: int, forks: int) -> None:
    """The controller's cost per host, and the re-run projected to ``target`` hosts."""
    if hosts == 0:
        return
    per_host = again.cpu / hosts
    cpu = per_host * target
    batches = math.ceil(target / forks)
    print(
        f"controller CPU: first run {first.cpu:.1f} s ({first.cpu / hosts:.1f} s per host), "
        f"re-run {again.cpu:.1f} s ({per_host:.1f} s per host, {hosts} hosts; the controller's fixed part "
        "counted per host too)"
    )
    print(
        f"projected re-run at {target} hosts: controller CPU {cpu / 60:.0f} min; {batches} batches of {forks} "
        f"forks at this re-run's {again.seconds:.0f} s = {batches * again.seconds / 60:.0f} min (assumptions: "
        "CPU per host constant, hosts answer as fast as these; the larger bound holds)"
    )
    for cores in sorted({os.cpu_count() or 1, 8, 16, 32}):
        print(f"  on {cores:>2} controller cores: >= {cpu / cores / 60:.0f} min of wall from the controller's CPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", default="inventories/local", help="inventory (default: inventories/local)")
    parser.add_argument("--reset", action="store_true", help="run playbooks/teardown.yml first")
    parser.add_argument(
        "--extra-vars", "-e", action="append", default=[], metavar="VARS", help="passed to every run (repeatable)"
    )
    parser.add_argument("--project", type=int, default=1000, help="project the re-run to this many hosts")
    parser.add_argument("--forks", type=int, default=_forks(), help="the controller's forks (default: ansible.cfg's)")
    args = parser.parse_args()

    print(f"site.yml -i {args.inventory}: a first run, then a no-change re-run")
    if args.reset:
        teardown = playbook("playbooks/teardown.yml", args.inventory, args.extra_vars)
        print(f"{'teardown':<10} {teardown.seconds:7.1f} s")
    first = playbook("site.yml", args.inventory, args.extra_vars)
    again = playbook("site.yml", args.inventory, args.extra_vars)
    first_changed, again_changed = changed_counts(first.report), changed_counts(again.report)
    print(f"{'first run':<10} {first.seconds:7.1f} s  changed={sum(first_changed.values())}")
    print(f"{'re-run':<10} {again.seconds:7.1f} s  changed={sum(again_changed.values())} {again_changed}")
    print(f"re-run / first run: {again.seconds / first.seconds:.0%} (issue 17 asks for at most 25 %)")
    # The controller (localhost) is not one of the hosts it pays for.
    _project(first, again, len([h for h in again_changed if h != "localhost"]), args.project, args.forks)

    rerun = tasks(again.report)
    ran = [t for t in rerun if t.ran]
    in_tasks = sum(t.seconds for t in rerun)
    print(
        f"re-run: {len(rerun)} tasks, {len(ran)} ran somewhere ({len(rerun) - len(ran)} skipped everywhere); "
        f"{in_tasks:.1f} s in tasks, {again.seconds - in_tasks:.1f} s outside them (start-up, includes, between tasks)"
    )
    print("\nthe re-run per play (tasks that ran / all, seconds in tasks):")
    plays: dict[str, list[Task]] = {}
    for task in rerun:
        plays.setdefault(task.play, []).append(task)
    for play, found in plays.items():
        print(f"{sum(t.seconds for t in found):8.2f}  {sum(t.ran for t in found):3}/{len(found):<3}  {play}")
    print("\nthe re-run's task executions per host (run + skipped; each a worker fork on the controller):")
    for host, plays_of in sorted(executions(again.report).items()):
        run, skipped = sum(c[0] for c in plays_of.values()), sum(c[1] for c in plays_of.values())
        busiest = sorted(plays_of.items(), key=lambda kv: -sum(kv[1]))[:3]
        print(
            f"  {host:<12} {run:3} run + {skipped:3} skipped  (most in: "
            + "; ".join(f"{name[:40]} {c[0]}+{c[1]}" for name, c in busiest)
            + ")"
        )
    print(f"\nthe re-run's {SLOWEST} slowest tasks:")
    print(f"{'seconds':>8}  task  [play]")
    for task in sorted(rerun, key=lambda t: t.seconds, reverse=True)[:SLOWEST]:
        print(f"{task.seconds:8.2f}  {task.name}  [{task.play}]")

    changed = [t for t in rerun if t.changed_on]
    if changed:
        print("\nNOT IDEMPOTENT: the re-run changed")
        for task in changed:
            print(f"  {task.name} [{task.play}] on {', '.join(task.changed_on)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
