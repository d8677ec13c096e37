"""The nvidia_driver role's GPU detection on the PCI bus (sysfs laid out in a folder)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, load_script


def _device(root: Path, address: str, vendor: str, klass: str) -> None:
    (root / address).mkdir(parents=True)
    (root / address / "vendor").write_text(vendor + "\n")
    (root / address / "class").write_text(klass + "\n")


def test_only_nvidia_display_and_3d_controllers_count(tmp_path: Path) -> None:
    pci = load_script(ROOT / "roles/nvidia_driver/files/nvidia_pci.py")
    _device(tmp_path, "0000:18:00.0", "0x10de", "0x030200")  # H100 SXM: 3D controller
    _device(tmp_path, "0000:3b:00.0", "0x10de", "0x030000")  # L40S: VGA controller
    _device(tmp_path, "0000:18:00.1", "0x10de", "0x040300")  # a GPU's audio function
    _device(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch (bridge)
    _device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's VGA
    (tmp_path / "0000:00:1f.0").mkdir()  # a device without readable ids
    assert pci.gpus(tmp_path) == ["0000:18:00.0", "0000:3b:00.0"]


def test_no_pci_bus_means_no_gpu(tmp_path: Path) -> None:
    pci = load_script(ROOT / "roles/nvidia_driver/files/nvidia_pci.py")
    assert pci.gpus(tmp_path / "absent") == []
