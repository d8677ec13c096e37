"""The serving image and a model folder reaching every node: the controller's path against the
cluster's own (issue 31). Prints figures, asserts nothing.

On the test hosts with their own Docker Engine (``python -m tests.hosts up --engines``, or this
script starts them), each step a run of tests/bench/distribute.yml:

* the image: the stand-in serving image's ``docker save`` file (tests/hosts/engine.py, 3.8 GiB)
  to every node, ``serving_image_transfer: controller`` (the file copied from the controller to
  each node and loaded there) against ``cluster_registry`` (loaded on the first node only, then
  pushed once to a registry it runs for the transfer and pulled by the others at once);
* the model: a folder of --model-gib GiB of random safetensors (incompressible, like weights)
  copied from the controller, ``model_cache_fanout: 0`` (every node copies it through the
  controller's link, Ansible's copy) against ``model_cache_fanout: 3`` (the first node copies it,
  the others rsync it from there);
* this machine's disk write bandwidth, measured in the same run (every test host writes to this
  one disk: on these hosts, that is the ceiling of any distribution).

Then a projection to --project nodes with its assumptions written out.

    python tests/bench/distribute.py [--nodes 3] [--model-gib 2] [--skip-image] [--project 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.hosts import common, engine, nodes  # noqa: E402

BIN = Path(sys.executable).parent
GIB = 1 << 30


def disk_write_gib_s(folder: Path, gib: float = 1.0) -> float:
    """Sequential write of ``gib`` GiB with fsync (what a copy's receiving side pays)."""
    block = os.urandom(16 << 20)
    path = folder / "vf-bench-disk"
    start = time.monotonic()
    with path.open("wb") as handle:
        for _ in range(int(gib * GIB) // len(block)):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.monotonic() - start
    path.unlink()
    return gib / seconds


def build_model(folder: Path, gib: float) -> int:
    """config.json and two safetensors shards of random bytes, whole for verify_model.py."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    per_shard = int(gib * GIB) // 2 // 4 * 4
    weight_map = {}
    for index in (1, 2):
        name = f"model-0000{index}-of-00002.safetensors"
        header = json.dumps({f"w{index}": {"dtype": "F32", "shape": [per_shard // 4], "data_offsets": [0, per_shard]}})
        with (folder / name).open("wb") as handle:
            handle.write(struct.pack("<Q", len(header)) + header.encode())
            left = per_shard
            while left:
                chunk = os.urandom(min(left, 64 << 20))
                handle.write(chunk)
                left -= len(chunk)
        weight_map[f"w{index}"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(p.stat().st_size for p in folder.iterdir())


def step(inventory: Path, name: str, **extra: object) -> float:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(BIN / "ansible-playbook"), "tests/bench/distribute.yml", "-i", str(inventory),
            "-e", json.dumps({"bench_step": name, **extra})]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"distribute.yml {name} {extra} failed (rc {done.returncode}):\n{done.stdout[-4000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--model-gib", type=float, default=2.0)
    parser.add_argument("--skip-image", action="store_true")
    parser.add_argument("--project", type=int, default=64, help="nodes to project the figures to")
    parser.add_argument(
        "--push-gib-s", type=float, default=3.76 / 118,
        help="docker push's rate (it gzips each layer on one core; measured here on 2026-12-06: 3.76 GiB in 118 s)",
    )  # fmt: skip
    args = parser.parse_args()
    if not nodes.engines_enabled():
        nodes.reset(args.nodes, engines=True)
    hosts = nodes.node_list(args.nodes)
    disk = disk_write_gib_s(common.HOME)
    with tempfile.TemporaryDirectory(prefix="vf-distribute-", dir=common.HOME) as tmp:
        inventory = Path(tmp) / "hosts.yml"
        base = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(nodes.KEY),
            "ansible_ssh_common_args": common.SSH_OPTIONS,
        }
        group = {n.name: {"ansible_host": n.address} for n in hosts}
        inventory.write_text(yaml.safe_dump({"all": {"children": {"bench": {"hosts": group}}, "vars": base}}))
        rows: list[tuple[str, str, float, float]] = []
        print(f"{len(hosts)} test hosts, one disk: sequential write {disk:.2f} GiB/s (fsync'd, this run)")
        step(inventory, "setup")
        if not args.skip_image:
            tarball, name = engine.serving_tarball(), engine.serving_image()
            size = tarball.stat().st_size / GIB
            image = {"serving_image_base": name, "serving_image_tarball": str(tarball),
                     "serving_image_transfer_dir": str(Path(tmp) / "images")}  # fmt: skip
            for transfer in ("controller", "cluster_registry"):
                step(inventory, "wipe_image", serving_image_base=name)
                seconds = step(inventory, "image", serving_image_transfer=transfer, **image)
                rows.append(("image", transfer, seconds, size))
            step(inventory, "wipe_image", serving_image_base=name)
        model = Path(tmp) / "model"
        size = build_model(model, args.model_gib) / GIB
        target = {"model_cache_source": str(model), "model_cache_dir": "/srv/models/vf-bench"}
        for fanout in (0, 3):
            step(inventory, "wipe_model", **target)
            seconds = step(inventory, "model", model_cache_fanout=fanout, **target)
            rows.append(("model", "controller" if fanout == 0 else f"fan-out k={fanout}", seconds, size))
        step(inventory, "wipe_model", **target)
    print(f"\n{'what':<6} {'path':<17} {'GiB':>6} {'wall':>8} {'GiB/s landed':>13} {'of disk':>8}")
    for what, path, seconds, gib in rows:
        landed = gib * len(hosts) / seconds
        print(f"{what:<6} {path:<17} {gib:>6.2f} {seconds:>7.0f}s {landed:>13.3f} {landed / disk:>7.0%}")
    print("GiB/s landed: the bytes every node ends with over the wall time; 'of disk': against this")
    print("machine's write bandwidth, which all hosts share (the ceiling here; real nodes have a disk each).")
    _projection(rows, len(hosts), args.project, args.push_gib_s)
    return 0


def _projection(rows: list[tuple[str, str, float, float]], count: int, target: int, push: float) -> None:
    """Each path's time at ``target`` nodes, from its own structure (stated), not fitted."""
    rounds = math.ceil(math.log(target, 3)) if target > 1 else 0
    print(f"\nProjection to {target} nodes (assumptions: a 10 Gb/s controller uplink = 1.16 GiB/s; nodes on")
    print("25 Gb/s = 2.9 GiB/s; a node's disk faster than its link; a 20 GiB image, compressed to 10 GiB")
    print("on the wire by the registry; a 690 GiB checkpoint; the fan-out's k = 3):")
    uplink, node_link = 1.16, 2.9
    print(f"  image through the controller: {target} x 20 GiB over its uplink = {target * 20 / uplink / 3600:.1f} h")
    push_s = 20 / push
    pulls_s = (target - 1) * 10 / node_link
    print(
        f"  image through the builder's registry: one push ({push_s / 3600:.2f} h at {push:.3f} GiB/s) + "
        f"{target - 1} x 10 GiB from one node's link ({pulls_s / 3600:.2f} h) = {(push_s + pulls_s) / 3600:.2f} h"
    )
    per_node = 20 / uplink
    crossover = math.ceil(push_s / max(per_node - 10 / node_link, 1e-9))
    slow = math.ceil(push_s / max(20 / 0.116 - 10 / node_link, 1e-9))
    print(f"  the registry pays off from about {crossover} nodes on that uplink, from {slow} on a 1 Gb/s one "
          "(a controller outside the cluster's network)")  # fmt: skip
    print(f"  model through the controller: {target} x 690 GiB over its uplink = {target * 690 / uplink / 3600:.1f} h")
    seed = 690 / uplink
    round_s = 3 * 690 / node_link
    print(f"  model by fan-out: one copy to the seed ({seed / 3600:.2f} h) + {rounds} rounds of 3 receivers "
          f"per sender ({round_s / 3600:.2f} h each) = {(seed + rounds * round_s) / 3600:.1f} h")  # fmt: skip
    print(f"(measured here with {count} nodes on one disk: {', '.join(f'{w} {p} {s:.0f} s' for w, p, s, _ in rows)})")


if __name__ == "__main__":
    raise SystemExit(main())
