"""gpu_facts parsing: nvidia-smi outputs, NICs, InfiniBand, routes and limits into planner facts."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES
from vllm_fleet.inventory import facts

F = FIXTURES / "facts"


def _raw(name: str, **extra: object) -> dict[str, object]:
    return {"query_gpu": (F / f"{name}.query.txt").read_text(), "topo": (F / f"{name}.topo.txt").read_text(), **extra}


@pytest.mark.parametrize(
    ("name", "gpu", "count", "memory", "nvlink", "cc"),
    [
        ("h100-sxm", "H100-SXM", 8, 79.65, True, "9.0"),
        ("a100-sxm", "A100-80G", 8, 80.0, True, "8.0"),
        ("l40s-pcie", "L40S", 4, 44.99, False, "8.9"),
        ("l20-pcie", "L20", 8, 44.99, False, "8.9"),
    ],
)
def test_gpu_hosts(name: str, gpu: str, count: int, memory: float, nvlink: bool, cc: str) -> None:
    host = facts.host_facts(_raw(name))
    assert (host["gpu"], host["gpu_count"], host["nvlink"], host["compute_capability"]) == (gpu, count, nvlink, cc)
    assert host["gpu_memory_gib"] == pytest.approx(memory, abs=0.01)
    assert [g["index"] for g in host["gpus"]] == list(range(count))
    assert len(host["nvlink_pairs"]) == (count * (count - 1) // 2 if nvlink else 0)


def test_topo_reads_nics_and_their_names() -> None:
    topo = facts.parse_topo((F / "h100-sxm.topo.txt").read_text())
    assert topo["nics"] == [f"NIC{i}" for i in range(8)]
    assert topo["nic_names"]["NIC3"] == "mlx5_3"
    assert topo["links"]["GPU0-NIC0"] == "PIX" and topo["links"]["GPU0-NIC4"] == "SYS"
    assert topo["links"]["GPU2-GPU5"] == "NV18"


def test_old_driver_topo_with_named_nic_columns() -> None:
    topo = facts.parse_topo((F / "old-driver-pcie.topo.txt").read_text())
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"] and topo["nics"] == ["mlx4_0"]
    assert topo["links"]["GPU0-GPU1"] == "PIX" and not topo["all_nvlink"]


def test_partial_nvlink_is_not_all_nvlink() -> None:
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tSYS\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n"
    topo = facts.parse_topo(text)
    assert topo["nvlink_pairs"] == [[0, 1]] and not topo["all_nvlink"]


def test_host_without_gpu_reports_zero_and_never_fails() -> None:
    host = facts.host_facts({"query_gpu": "", "topo": "", "net": "lo -1 unknown\neth0 -1 up\n"})
    assert host["gpu_count"] == 0 and host["gpu"] is None and not host["nvlink"] and host["gpu_memory_gib"] is None
    # nvidia-smi present but failing prints an error, not CSV
    broken = facts.host_facts({"query_gpu": "NVIDIA-SMI has failed because it couldn't communicate with the driver."})
    assert broken["gpu_count"] == 0


def test_unknown_or_mixed_products() -> None:
    one = facts.host_facts({"query_gpu": "0, NVIDIA Future GPU, 200000, 199000, 11.0, 600.1\n"})
    assert one["gpu"] == "NVIDIA Future GPU" and one["gpu_memory_gib"] == pytest.approx(195.31, abs=0.01)
    mixed = facts.host_facts(
        {"query_gpu": "0, NVIDIA L40S, 46068, 45000, 8.9, 550.1\n1, NVIDIA L4, 23034, 22000, 8.9, 550.1\n"}
    )
    assert mixed["gpu"] == "mixed" and mixed["gpu_names"] == ["NVIDIA L4", "NVIDIA L40S"]


def test_multi_nic_host() -> None:
    host = facts.host_facts({"net": (F / "multi-nic.net.txt").read_text(), "ib": (F / "multi-nic.ib.txt").read_text()})
    assert [n["name"] for n in host["nics"]] == ["eno1", "eno2", "ens6f0np0", "ens7f0", "bond0"]
    assert host["nic_gbps"] == 400.0  # the active NDR ports, not the down SDR one
    without_ib = facts.host_facts({"net": (F / "multi-nic.net.txt").read_text()})
    assert without_ib["nic_gbps"] == 100.0  # fastest physical port that is up (veth/docker0 ignored)
    assert [p["state"] for p in host["infiniband"]] == ["ACTIVE", "ACTIVE", "DOWN"]


def test_route_limits_secure_boot_and_cuda() -> None:
    route = facts.parse_route("10.0.0.11 dev ens6f0np0 src 10.0.0.12 uid 0 \\    cache ")
    assert route == {"interface": "ens6f0np0", "address": "10.0.0.12"}
    on_head = facts.parse_route(
        "local 10.0.0.11 dev lo table local src 10.0.0.11 uid 0",
        "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 10.0.0.11/24 brd 10.0.0.255 scope global eth0",
    )
    assert on_head == {"interface": "eth0", "address": "10.0.0.11"}
    assert facts.parse_memlock("unlimited") == -1 and facts.parse_memlock("8192") == 8 * 1024 * 1024
    assert facts.parse_memlock("") is None
    assert facts.parse_secure_boot("SecureBoot enabled") is True
    assert facts.parse_secure_boot("SecureBoot disabled\nPlatform is in Setup Mode") is False
    assert facts.parse_secure_boot("EFI variables are not supported on this system") is False
    assert facts.parse_secure_boot("") is None
    assert facts.parse_cuda_version((F / "nvidia-smi-q.txt").read_text()) == "12.4"
    host = facts.host_facts({"shm": "     1B-blocks\n2147483648\n", "memlock": "8192", "runtimes": ["docker"]})
    assert host["shm_bytes"] == 2147483648 and host["memlock_bytes"] == 8388608
    assert host["container_runtimes"] == ["docker"]


def test_integrated_gpu_takes_the_hosts_memory() -> None:
    """A DGX Spark's GB10 has no memory of its own ("[N/A]"): its total is the host's MemTotal,
    as CUDA reports it, and no GPU free figure is reported (vLLM reads MemAvailable, which the
    fleet's own processes draw on once they run): the planner's reserve stands in."""
    host = facts.host_facts(_raw("gb10", meminfo=(F / "gb10.meminfo.txt").read_text()))
    assert (host["gpu"], host["gpu_count"], host["unified_memory"], host["compute_capability"]) == (
        "GB10",
        1,
        True,
        "12.1",
    )
    assert host["gpu_memory_gib"] == pytest.approx(121.69, abs=0.01)
    assert host["gpu_free_gib"] is None and host["host_memory_available_gib"] == pytest.approx(110.0, abs=0.01)
    # Without /proc/meminfo the catalog's total stands; an unknown integrated part still counts as one.
    assert facts.host_facts(_raw("gb10"))["gpu_memory_gib"] == pytest.approx(121.69, abs=0.01)
    thor = "0, NVIDIA Thor, [N/A], [N/A], 11.0, 580.1\n"
    other = facts.host_facts({"query_gpu": thor, "meminfo": "MemTotal: 1048576 kB\n"})
    assert other["unified_memory"] and other["gpu_memory_gib"] == 1.0
    # A known discrete GPU whose memory nvidia-smi does not answer (MIG, a container without the
    # permission) stays discrete: its 0 GiB is refused by the planner, not read from the host.
    denied = "0, NVIDIA H200, [Insufficient Permissions], [Insufficient Permissions], 9.0, 570.1\n"
    h200 = facts.host_facts({"query_gpu": denied, "meminfo": "MemTotal: 2113929216 kB\n"})
    assert not h200["unified_memory"] and h200["gpu_memory_gib"] == 0.0
    unknown = "0, NVIDIA Future, [N/A], [N/A], 10.0, 600.1\n"
    assert not facts.host_facts({"query_gpu": unknown, "meminfo": "MemTotal: 1048576 kB\n"})["unified_memory"]
    # A discrete GPU is not unified memory and keeps its own free figure.
    h100 = facts.host_facts(_raw("h100-sxm"))
    assert not h100["unified_memory"] and h100["gpu_free_gib"] is not None


def test_meminfo_lines() -> None:
    assert facts.parse_meminfo("MemTotal:  2048 kB\nHugePages_Total: 0\nbad line\n") == {"MemTotal": 2 << 20}
