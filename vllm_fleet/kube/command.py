"""``vllm-fleet kubernetes``: the plan as manifests (its flags parsed by vllm_fleet/cli.py).

The plan comes from a file (``--plan``: artifacts/plan.json of a run, or ``vllm-fleet plan
--json``) or from an inventory (``-i``: its plan play runs with ``--tags plan`` into a
temporary folder, reaching no host, so every node's GPUs must be stated there). The pods run
a pulled vllm-openai image, which holds no Ray: the plan is made as for the container path's
``serving_image_mode: pulled``, so ``vllm_fleet_multinode_backend: auto`` picks vLLM's native
multi-node mode where the Ansible path's derived image (Ray inside) would pick Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_fleet import tools
from vllm_fleet.deploy.records import SERVE_KEYS
from vllm_fleet.errors import PlanError
from vllm_fleet.inventory import interface
from vllm_fleet.inventory.interface import PREFIX
from vllm_fleet.kube.manifests import manifests, to_yaml
from vllm_fleet.kube.options import FLAGS, KubeOptions

ROOT = Path(__file__).resolve().parents[2]


def read_plan(path: Path, flag: str) -> dict[str, Any]:
    fix = "pass artifacts/plan.json of a run, or the output of `vllm-fleet plan --json`"
    try:
        plan = json.loads(path.read_text())
    except OSError as exc:
        raise PlanError(flag, f"cannot read {path}: {exc.strerror or exc}", fix) from exc
    except ValueError as exc:
        raise PlanError(flag, f"{path} is not JSON ({exc})", fix) from exc
    if isinstance(plan, dict) and "instances" not in plan and "models" in plan:
        raise PlanError(
            flag,
            f"{path} is an allocation (`plan --models --json`), not a plan",
            "pass -i INVENTORY (vllm_fleet_models), or the artifacts/plan.json its run wrote",
        )
    if not isinstance(plan, dict):
        raise PlanError(flag, f"{path} is not a plan (a JSON object with instances)", fix)
    return plan


def site_playbook() -> Path:
    """site.yml of a checkout, or of the installed collection (playbooks/site.yml)."""
    for path in (ROOT / "site.yml", ROOT / "playbooks" / "site.yml"):
        if path.is_file():
            return path
    raise PlanError(
        "--inventory",
        f"no site.yml beside this vllm-fleet ({ROOT})",
        "run it from a checkout or the vllm_fleet.core collection, or pass --plan artifacts/plan.json",
    )


def plan_from_inventory(inventory: str) -> dict[str, Any]:
    """The inventory's plan, computed by its own plan play (``--tags plan``: no host is reached)."""
    playbook = site_playbook()
    with tempfile.TemporaryDirectory(prefix="vllm-fleet-kubernetes-") as tmp:
        argv = [
            tools.tool("ansible-playbook", "--inventory"),
            str(playbook),
            "-i",
            tools.inventory(inventory),
            "--tags",
            "plan",
            "-e",
            f"vllm_fleet_artifacts_dir={tmp}",
            "-e",
            "serving_image_mode=pulled",
        ]
        # The playbook's own output goes to stderr as it runs: stdout is the manifests.
        try:
            sink: Any = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            sink = subprocess.PIPE  # stderr is not a file (a test's capture): passed on after
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False, env=dict(os.environ), text=True)
        if done.stdout:
            sys.stderr.write(done.stdout)
        path = Path(tmp) / "plan.json"
        if done.returncode != 0 or not path.exists():
            raise PlanError(
                "--inventory",
                f"planning failed (ansible-playbook exit {done.returncode})",
                "see its output above; the inventory must state every node's GPUs (vllm_fleet_gpu, _gpu_count)",
            )
        return read_plan(path, "--inventory")


def serve_options(inventory: str, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """Each plan node's serving options (trust_remote_code, the parsers, extra_args, extra_env, ...)
    as its inventory sets them, typed and defaulted as the Ansible path reads them."""
    argv = [tools.tool("ansible-inventory", "--inventory"), "-i", tools.inventory(inventory), "--list"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlanError("--inventory", f"ansible-inventory failed (exit {done.returncode}): {last}", "check the path")
    hostvars = dict((json.loads(done.stdout).get("_meta") or {}).get("hostvars") or {})
    wanted = {f"{PREFIX}{k}" for k in SERVE_KEYS}
    out = {}
    for node in nodes:
        raw = {k: v for k, v in dict(hostvars.get(node) or {}).items() if k in wanted}
        settings = interface.resolve(raw)
        out[node] = {k: settings.get(k) for k in SERVE_KEYS}
    return out


def options_from(args: argparse.Namespace) -> KubeOptions:
    given = {f.name: getattr(args, f.name) for f in FLAGS if getattr(args, f.name, None) is not None}
    if "gpu_product" in given:
        given["gpu_product"] = tuple(given["gpu_product"])
    return KubeOptions(**given)


def run_args(args: argparse.Namespace) -> int:
    opts = options_from(args)
    plan = plan_from_inventory(args.inventory) if args.inventory else read_plan(args.plan, "--plan")
    given = serve_options(args.inventory, [str(n["name"]) for n in plan.get("nodes") or []]) if args.inventory else None
    try:
        objects, notes = manifests(plan, opts, given)
    except PlanError:
        raise
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        # A hand-edited or foreign plan file: name what broke, not a traceback.
        raise PlanError(
            "--plan" if args.plan else "--inventory",
            f"malformed plan ({type(exc).__name__}: {exc})",
            "write it with `vllm-fleet plan --json` or `ansible-playbook site.yml --tags plan`",
        ) from exc
    source = args.inventory or str(args.plan)
    header = f"# vllm-fleet {plan.get('summary') or ''}\n# rendered by `vllm-fleet kubernetes` from {source}\n"
    text = to_yaml(objects, header)
    if args.output is None or str(args.output) == "-":
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    kinds: dict[str, int] = {}
    for o in objects:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    print("kubernetes: " + ", ".join(f"{n} {k}" for k, n in kinds.items()), file=sys.stderr)
    for note in notes:
        print(f"kubernetes: {note}", file=sys.stderr)
    return 0
