"""``vllm-fleet calibrate``: the cluster's own speed from a verify run, as the factors the next
plan reads (``vllm_fleet_calibration``).

Verify sends a bounded load shaped like the workload and keeps, for each endpoint, the measured
output throughput and median TPOT and TTFT beside the plan's prediction and the calibration
that prediction used. A step's time shows in both TPOT (measured / predicted) and throughput
(predicted / measured): the new step factor is the old one times their geometric mean over the
endpoints; the TTFT factor is the old one times the TTFT ratio beyond what the step factor
already moves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vllm_fleet.errors import PlanError


def _ratios(row: dict[str, Any]) -> tuple[float, float] | None:
    load = row.get("load") or {}
    tput = (load.get("output_token_throughput") or {}).get("ratio")
    tpot = (load.get("tpot_ms") or {}).get("ratio")
    ttft = (load.get("ttft_ms") or {}).get("ratio")
    if not tput or not tpot or not ttft or load.get("failed"):
        return None
    return math.sqrt(tpot / tput), ttft


def calibration(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The factors, with what they came from; raises PlanError when no endpoint measured a load."""
    found = [(r, _ratios(r)) for r in rows]
    usable = [(r, x) for r, x in found if x is not None]
    if not usable:
        raise PlanError(
            "verify.json",
            "holds no endpoint whose load was measured (every request answered, with the plan's prediction)",
            "run the verify phase of site.yml again (its load needs a plan made by this release)",
        )
    step = math.exp(sum(math.log(x[0]) for _, x in usable) / len(usable))
    ttft = math.exp(sum(math.log(x[1]) for _, x in usable) / len(usable))
    old = (usable[0][0].get("load") or {}).get("calibration") or {}
    old_step, old_ttft = float(old.get("step_time") or 1.0), float(old.get("ttft") or 1.0)
    return {
        "step_time": round(old_step * step, 3),
        "ttft": round(old_ttft * ttft / step, 3),
        "from": [str(r.get("endpoint")) for r, _ in usable],
    }


def read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError("verify.json", f"cannot read {path}: {exc}", "pass artifacts/verify.json of a run") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise PlanError("verify.json", f"{path} is not verify's list of rows", "pass artifacts/verify.json of a run")
    return rows
