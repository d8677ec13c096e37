"""The nvidia_driver role's GPU and NVSwitch detection on the PCI bus (sysfs laid out in a folder)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, load_script

SCRIPT = ROOT / "roles/nvidia_driver/files/nvidia_pci.py"
# One `lspci -Dnn` line: address, class [cccc], then the last [vendor:device]. The Molecule scenario
# reads the same listings with the same pattern.
LSPCI = re.compile(
    r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) [^\[]*\[([0-9a-f]{4})\]: .*\[([0-9a-f]{4}):([0-9a-f]{4})\]",
    re.MULTILINE,
)


def _device(root: Path, address: str, vendor: str, klass: str, device: str = "0x0000") -> None:
    (root / address).mkdir(parents=True)
    (root / address / "vendor").write_text(vendor + "\n")
    (root / address / "device").write_text(device + "\n")
    (root / address / "class").write_text(klass + "\n")


def _sysfs_from_lspci(listing: str, root: Path) -> Path:
    """Lay out /sys/bus/pci/devices as the kernel shows the functions of an `lspci -Dnn` listing
    (class 0x<cccc>00: none of the functions that matter has a programming interface)."""
    lines = LSPCI.findall((FIXTURES / "pci" / listing).read_text())
    assert lines, listing
    for address, klass, vendor, device in lines:
        _device(root, address, f"0x{vendor}", f"0x{klass}00", f"0x{device}")
    return root


def test_only_nvidia_display_and_3d_controllers_count(tmp_path: Path) -> None:
    pci = load_script(SCRIPT)
    _device(tmp_path, "0000:18:00.0", "0x10de", "0x030200")  # H100 SXM: 3D controller
    _device(tmp_path, "0000:3b:00.0", "0x10de", "0x030000")  # L40S: VGA controller
    _device(tmp_path, "0000:18:00.1", "0x10de", "0x040300")  # a GPU's audio function
    _device(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch (bridge)
    _device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's VGA
    _device(tmp_path, "0000:00:1c.0", "0x8086", "0x068000")  # another vendor's bridge of the same class
    (tmp_path / "0000:00:1f.0").mkdir()  # a device without readable ids
    assert pci.gpus(tmp_path) == ["0000:18:00.0", "0000:3b:00.0"]
    assert pci.nvswitches(tmp_path) == ["0000:05:00.0"]


@pytest.mark.parametrize(
    ("listing", "gpus", "switches", "first_switch"),
    [
        ("hgx_h100_8gpu.lspci", 8, 4, "0000:05:00.0"),
        ("hgx_a100_8gpu.lspci", 8, 6, "0000:c4:00.0"),
        ("pcie_4x_l40s.lspci", 4, 0, None),
    ],
    ids=["hgx-h100-needs-fabric-manager", "hgx-a100-needs-fabric-manager", "pcie-l40s-does-not"],
)
def test_recorded_listings(listing: str, gpus: int, switches: int, first_switch: str | None, tmp_path: Path) -> None:
    pci = load_script(SCRIPT)
    found = pci.listing(_sysfs_from_lspci(listing, tmp_path))
    assert (found["count"], found["nvswitches"], found["fabricmanager_needed"]) == (gpus, switches, switches > 0)
    assert found["nvswitch_addresses"][:1] == ([first_switch] if first_switch else [])
    assert "0000:03:00.0" not in found["addresses"] and "0000:02:00.0" not in found["addresses"]  # the BMC's VGA


def test_the_script_prints_what_the_role_reads(tmp_path: Path) -> None:
    """The role runs it with the hosts' python3 and reads count, nvswitches and fabricmanager_needed."""
    root = _sysfs_from_lspci("hgx_h100_8gpu.lspci", tmp_path / "pci")
    done = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert set(found) == {"count", "addresses", "nvswitches", "nvswitch_addresses", "fabricmanager_needed"}
    assert found["addresses"][0] == "0000:1b:00.0" and found["fabricmanager_needed"] is True


def test_no_pci_bus_means_no_gpu_and_no_switch(tmp_path: Path) -> None:
    pci = load_script(SCRIPT)
    assert pci.listing(tmp_path / "absent") == {
        "count": 0,
        "addresses": [],
        "nvswitches": 0,
        "nvswitch_addresses": [],
        "fabricmanager_needed": False,
    }
