"""The plan phase at fleet scale (no host is reached): ``site.yml --tags plan`` on generated
inventories of N hosts with stated GPUs (8 x H100 each, Llama-3.1-70B, the gateway on), its
wall time and the controller's peak RSS (the largest process of the run, which is
ansible-playbook's own), next to Ansible's floor on the same inventory in the same run (one
localhost play that reads every host's variables: tests/bench/files/floor.yml), each the best
of --repeat runs; and the size of one node's deployment record as the cluster grows.

    python tests/bench/scale.py [--hosts 32,128,1000,4000] [--repeat 3] [--timeout 900]

Targets (issue 48): 1,000 hosts within 2x the floor, 4,000 hosts <= 60 s and <= 2 GiB; one
record <= 16 KiB at 1,000 nodes. A size whose run passes --timeout is printed as such and the
larger ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_fleet.deploy import records  # noqa: E402
from vllm_fleet.inventory import interface  # noqa: E402
from vllm_fleet.model.spec import load_model  # noqa: E402
from vllm_fleet.planning.cluster import cluster_from_data  # noqa: E402
from vllm_fleet.planning.strategy import Wishes, plan_cluster  # noqa: E402

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
BIN = Path(sys.executable).parent


def _address(i: int) -> str:
    return f"10.{64 + i // 65536}.{i // 256 % 256}.{i % 256}"


def inventory(folder: Path, hosts: int) -> Path:
    nodes = {
        f"gpu-{i:04d}": {"ansible_host": _address(i), "vllm_fleet_gpu": "H100-SXM", "vllm_fleet_gpu_count": 8,
                         "vllm_fleet_nvlink": True, "vllm_fleet_nic_gbps": 400, "vllm_fleet_interface": "eth0"}
        for i in range(hosts)
    }  # fmt: skip
    data = {"all": {
        "hosts": {"localhost": {"ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}"}},
        "vars": {"vllm_fleet_model": MODEL, "vllm_fleet_max_model_len": 8192, "vllm_fleet_gateway": "true"},
        "children": {"vllm_nodes": {"hosts": nodes}},
    }}  # fmt: skip
    path = folder / f"hosts-{hosts}.json"
    path.write_text(json.dumps(data))
    return path


FLOOR = ROOT / "tests/bench/files/floor.yml"


def _timed(argv: list[str], timeout: float) -> tuple[float | None, float, subprocess.CompletedProcess[str] | None]:
    """(seconds or None past the timeout, peak RSS in MiB of this run's largest process, the run)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    wrapped = ["/usr/bin/time", "-f", "%M", *argv] if Path("/usr/bin/time").exists() else argv
    start = time.monotonic()
    try:
        done = subprocess.run(wrapped, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, 0.0, None
    seconds = time.monotonic() - start
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    rss = int(last) / 1024 if wrapped is not argv and last.isdigit() else 0.0  # KiB -> MiB
    return seconds, rss, done


def plan_phase(hosts: int, timeout: float, repeat: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="vf-scale-") as tmp:
        inv = inventory(Path(tmp), hosts)
        argv = [str(BIN / "ansible-playbook"), "site.yml", "-i", str(inv), "--tags", "plan",
                "-e", f"vllm_fleet_artifacts_dir={tmp}/artifacts"]  # fmt: skip
        floor_argv = [str(BIN / "ansible-playbook"), str(FLOOR), "-i", str(inv)]
        best: dict[str, object] = {}
        for _ in range(repeat):
            seconds, rss, done = _timed(argv, timeout)
            if seconds is None or done is None:
                return {"hosts": hosts, "seconds": None, "note": f"over {timeout:.0f} s (stopped)"}
            plan = Path(tmp, "artifacts", "plan.json")
            ok = done.returncode == 0 and plan.exists()
            if not ok:
                return {"hosts": hosts, "seconds": round(seconds, 1), "peak_rss_mib": round(rss), "floor": None,
                        "plan_json_kib": None, "note": done.stdout[-600:]}  # fmt: skip
            floor, _, floor_done = _timed(floor_argv, timeout)
            if floor_done is None or floor_done.returncode != 0:
                floor = None
            if not best or seconds < float(str(best["seconds"])):
                best = {"hosts": hosts, "seconds": round(seconds, 2), "peak_rss_mib": round(rss),
                        "plan_json_kib": round(plan.stat().st_size / 1024), "note": ""}  # fmt: skip
            if floor is not None and (best.get("floor") is None or floor < float(str(best["floor"]))):
                best["floor"] = round(floor, 2)
        return best


def record_size(nodes: int) -> dict[str, object]:
    """One node's record (the last node: a replica, not the gateway host) as JSON."""
    data = [{"name": f"gpu-{i:04d}", "gpu": "H100-SXM", "gpu_count": 8, "nvlink": True, "nic_gbps": 400,
             "address": _address(i), "interface": "eth0"} for i in range(nodes)]  # fmt: skip
    start = time.monotonic()
    plan = plan_cluster(load_model(MODEL), cluster_from_data({"nodes": data}), Wishes(max_model_len=8192))
    planned = time.monotonic() - start
    settings = interface.resolve({"vllm_fleet_model": MODEL, "vllm_fleet_gateway": "true"})
    last = data[-1]["name"]
    rec = records.node_record(plan, last, settings, {"addresses": {}})
    parts = {k: len(json.dumps(v)) for k, v in rec.items()}
    big = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    return {"nodes": nodes, "record_kib": round(len(json.dumps(rec)) / 1024, 1), "plan_s": round(planned, 2),
            "largest_parts": ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in big)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="32,128,1000,4000")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each size; the best is printed")
    parser.add_argument("--records", default="10,100,1000")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    print(f"one node's record ({MODEL}, 8 x H100 per node, gateway on)")
    print(f"{'nodes':>6} {'record':>10} {'plan':>7}  largest parts")
    for n in (int(x) for x in args.records.split(",")):
        r = record_size(n)
        print(f"{r['nodes']:>6} {r['record_kib']:>7} KiB {r['plan_s']:>6}s  {r['largest_parts']}")
    print(f"\nsite.yml --tags plan ({os.cpu_count()} cores; best of {args.repeat})")
    print(f"{'hosts':>6} {'time':>8} {'floor':>7} {'ratio':>6} {'peak RSS':>9} {'plan.json':>10}  note")
    for n in (int(x) for x in args.hosts.split(",")):
        r = plan_phase(n, args.timeout, args.repeat)
        if r["seconds"] is None:
            print(f"{n:>6} {'-':>8} {'-':>7} {'-':>6} {'-':>9} {'-':>10}  {r['note']}")
            break
        floor = r.get("floor")
        ratio = f"{float(str(r['seconds'])) / float(str(floor)):.1f}x" if floor else "-"
        print(f"{n:>6} {r['seconds']:>7}s {floor!s:>6}s {ratio:>6} {r['peak_rss_mib']:>5} MiB "
              f"{r['plan_json_kib']!s:>6} KiB  {r['note']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
