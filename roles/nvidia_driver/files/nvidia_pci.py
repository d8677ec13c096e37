"""Count NVIDIA display/3D controllers on the PCI bus (vendor 0x10de, class 0x0300xx/0x0302xx).

NVSwitches (bridges, class 0x0680xx) and the GPUs' audio functions are not GPUs. Prints JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def gpus(root: Path) -> list[str]:
    found = []
    for device in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(device.name)
    return found


if __name__ == "__main__":
    addresses = gpus(Path(sys.argv[1] if len(sys.argv) > 1 else "/sys/bus/pci/devices"))
    print(json.dumps({"count": len(addresses), "addresses": addresses}))
