"""NVIDIA GPUs and NVSwitches on the PCI bus (vendor 0x10de), from sysfs. Prints JSON.

GPUs are display/3D controllers (class 0x0300xx/0x0302xx). NVSwitches are bridges (class
0x0680xx: 10de:1af1 on HGX A100, 10de:22a3 on HGX H100/H200); a board with them needs
nvidia-fabricmanager running before CUDA initialises. The GPUs' audio functions (0x0403xx)
are neither. Runs on the hosts' own python3 (3.9 on EL 9).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"


def _nvidia_devices(root: Path) -> list[tuple[str, str]]:
    """(address, class) of every NVIDIA function, sorted by address; unreadable entries are skipped."""
    found = []
    for device in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA:
            found.append((device.name, klass))
    return found


def gpus(root: Path) -> list[str]:
    return [address for address, klass in _nvidia_devices(root) if klass[:6] in GPU_CLASSES]


def nvswitches(root: Path) -> list[str]:
    return [address for address, klass in _nvidia_devices(root) if klass[:6] == NVSWITCH_CLASS]


def listing(root: Path) -> dict[str, object]:
    """What the role records: the GPUs, the NVSwitches and whether a fabric manager is needed."""
    gpu_addresses, switch_addresses = gpus(root), nvswitches(root)
    return {
        "count": len(gpu_addresses),
        "addresses": gpu_addresses,
        "nvswitches": len(switch_addresses),
        "nvswitch_addresses": switch_addresses,
        "fabricmanager_needed": bool(switch_addresses),
    }


if __name__ == "__main__":
    print(json.dumps(listing(Path(sys.argv[1] if len(sys.argv) > 1 else "/sys/bus/pci/devices"))))
