"""vllm_server's AMX permission request (roles/vllm_server/files/vllm_fleet_amx.py), run the
way the CPU build's venv runs it: at interpreter start, before anything else. Where the CPU
has AMX the process may use its tiles afterwards; elsewhere it asks nothing."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

MODULE = ROOT / "roles/vllm_server/files/vllm_fleet_amx.py"

PROBE = f"""
import ctypes, json, runpy
namespace = runpy.run_path({str(MODULE)!r})
mask = ctypes.c_ulong(0)
ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask))  # ARCH_GET_XCOMP_PERM
print(json.dumps({{"amx": namespace["has_amx"](), "permitted": bool(mask.value >> 18 & 1),
                  "again": namespace["request"]()}}))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86_64 Linux only")
def test_a_process_that_ran_it_may_use_amx_exactly_where_the_cpu_has_it() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(done.stdout)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next(line for line in cpuinfo if line.startswith("flags")).split()
    assert state["amx"] == ("amx_tile" in flags)
    assert state["permitted"] == state["amx"], state
    assert state["again"] == state["amx"], state  # asking twice is harmless
