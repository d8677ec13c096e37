"""The planner against the real vLLM logs in ../shared/datasets (skipped when absent)."""

from __future__ import annotations

import statistics

import pytest
import yaml

from tests.bench.memory_accuracy import DEFAULT_DATASET, EXCLUDED, run_entry

pytestmark = pytest.mark.skipif(not DEFAULT_DATASET.is_file(), reason="shared dataset not present")


def _rows() -> list[dict[str, object]]:
    data = yaml.safe_load(DEFAULT_DATASET.read_text())
    return [run_entry(e, data.get("models", {})) for e in data["entries"] if e["id"] not in EXCLUDED]


def test_no_entry_errors() -> None:
    assert [r for r in _rows() if "error" in r] == []


@pytest.mark.parametrize(("key", "limit"), [("weights", 0.02), ("kv_pool", 0.05), ("kv_bytes_per_token", 0.005)])
def test_median_error_within_target(key: str, limit: float) -> None:
    errors = [r[key][2] for r in _rows() if r.get(key) and r[key][2] is not None]  # type: ignore[index]
    assert errors, key
    assert statistics.median(errors) <= limit  # type: ignore[type-var]
