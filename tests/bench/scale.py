"""The plan phase at fleet scale (no host is reached): ``site.yml --tags plan`` on generated
inventories of N hosts with stated GPUs (8 x H100 each, Llama-3.1-70B, the gateway on), its
wall time and the controller's peak RSS (the largest process of the run, which is
ansible-playbook's own), next to ``vllm-fleet plan`` for the same cluster; and the size of one
node's deployment record as the cluster grows.

    python tests/bench/scale.py [--hosts 32,128,512,1000] [--timeout 900]

Targets (issue: the plan phase at fleet scale): 1,000 hosts <= 60 s and <= 1 GiB, 128 hosts
<= 10 s, one record <= 16 KiB at 1,000 nodes. A size whose run passes --timeout is printed as
such and the larger ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def plan_phase(hosts: int, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="vf-scale-") as tmp:
        inv = inventory(Path(tmp), hosts)
        argv = [str(BIN / "ansible-playbook"), "site.yml", "-i", str(inv), "--tags", "plan",
                "-e", f"vllm_fleet_artifacts_dir={tmp}/artifacts"]  # fmt: skip
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        start = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"hosts": hosts, "seconds": None, "note": f"over {timeout:.0f} s (stopped)"}
        seconds = time.monotonic() - start
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB; the largest child
        plan = Path(tmp, "artifacts", "plan.json")
        ok = done.returncode == 0 and plan.exists()
        return {"hosts": hosts, "seconds": round(seconds, 1), "peak_rss_mib": round(rss), "ok": ok,
                "plan_json_kib": round(plan.stat().st_size / 1024) if plan.exists() else None,
                "note": "" if ok else done.stdout[-600:]}  # fmt: skip


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
    parser.add_argument("--hosts", default="32,128,512,1000")
    parser.add_argument("--records", default="10,100,1000")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    print(f"one node's record ({MODEL}, 8 x H100 per node, gateway on)")
    print(f"{'nodes':>6} {'record':>10} {'plan':>7}  largest parts")
    for n in (int(x) for x in args.records.split(",")):
        r = record_size(n)
        print(f"{r['nodes']:>6} {r['record_kib']:>7} KiB {r['plan_s']:>6}s  {r['largest_parts']}")
    print(f"\nsite.yml --tags plan ({os.cpu_count()} cores)")
    print(f"{'hosts':>6} {'time':>8} {'peak RSS':>9} {'plan.json':>10}  note")
    for n in (int(x) for x in args.hosts.split(",")):
        r = plan_phase(n, args.timeout)
        if r["seconds"] is None:
            print(f"{n:>6} {'-':>8} {'-':>9} {'-':>10}  {r['note']}")
            break
        print(f"{n:>6} {r['seconds']:>7}s {r['peak_rss_mib']:>5} MiB {r['plan_json_kib']!s:>6} KiB  {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
