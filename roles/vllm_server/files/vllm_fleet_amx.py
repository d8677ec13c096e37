"""Installed by vllm-fleet (vllm_server) into the CPU build's venv, imported by
vllm_fleet_amx.pth at every interpreter start: asks Linux for permission to use Intel AMX
tiles in this process.

vLLM's CPU attention picks its AMX kernel for bfloat16 whenever the CPU has AMX
(torch.cpu._is_amx_tile_supported(), which reads CPUID only), but never asks the kernel for
AMX state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+). A process whose oneDNN has not
asked first dies with SIGILL at its first attention call: vLLM logs "Worker proc
VllmWorker-0 died unexpectedly (exit code: None)" at the first request after start.
Whether oneDNN asked first differs from one start to the next, so one start serves and the
restart after it dies. Asking at start is one system call; a kernel that refuses
(or a CPU without AMX) changes nothing.
"""

from __future__ import annotations

import ctypes

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def request() -> bool:
    """True when this process may use AMX tiles now."""
    if not has_amx():
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


request()
