"""NCCL's transports from NCCL_DEBUG=INFO lines, against what the node's facts promise.

The lines follow ones posted in public NCCL threads (host names and addresses changed):
* GPUDirect RDMA over IB, "via NET/IB/5/GDRDMA": https://github.com/NVIDIA/nccl/issues/707
* no RDMA device and a socket fallback, "NET/IB : No device found" then "via NET/Socket/3"
  next to "via P2P/IPC/read": https://github.com/NVIDIA/nccl/issues/952
* RoCE devices, "NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB ..." and
  "Using network IB": https://github.com/NVIDIA/nccl-tests/issues/185
* the RDMA plugin, "via NET/IBext_v8/3/GDRDMA" with "via P2P/CUMEM":
  https://github.com/NVIDIA/nccl-tests/issues/252
* "Using network Socket" with IB disabled: https://github.com/NVIDIA/nccl/issues/1053
"""

from __future__ import annotations

from typing import Any

import pytest

from vllm_fleet.inventory.facts import host_facts
from vllm_fleet.ops import nccl
from vllm_fleet.ops.doctor import FAIL, PASS, SKIP, WARN

# As a vLLM worker's log shows them: the Ray actor's prefix, then NCCL's host:pid:tid [dev].
W = "(RayWorkerWrapper pid=4321, ip=10.0.0.2) node2:4321:4400 [0] NCCL INFO "

IB_GDR = [
    W + "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
    W + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:192.168.11.1<0>",
    W + "NET/Socket : Using [0]ib0:192.168.11.1<0> [1]eth0:10.0.0.2<0>",  # printed too: no proof alone
    W + "Using network IB",
    W + "Channel 00/0 : 1[1] -> 0[0] via P2P/IPC",
    W + "Channel 01/0 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA",
    W + "Channel 01/0 : 0[87000] -> 2[c7000] [send] via NET/IB/5/GDRDMA",
    W + "24 coll channels, 0 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
]

SOCKET_FALLBACK = [
    W + "Bootstrap : Using ibp12s0:10.149.0.32<0>",
    W + "NET/IB : No device found.",
    W + "NET/Socket : Using [0]ibp12s0:10.149.0.32<0>",
    W + "Using network Socket",
    W + "Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read",
    W + "Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
    W + "Channel 07/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
]

ROCE = [
    W + "NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>",
    W + "Using non-device net plugin version 0",
    W + "Using network IB",
    W + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
    W + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/1",
    W + "Channel 00/0 : 0[0] -> 1[0] via SHM/direct/direct",
]

IBEXT = [
    W + "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
    W + "P2P plugin IBext_v8",
    W + "NET/IB : Using [0]ibp0:1/IB/SHARP [1]ibp1:1/IB/SHARP [RO]; OOB eth0:10.7.147.73<0>",
    W + "Using network IBext_v8",
    W + "Channel 02/0 : 2[2] -> 0[0] via P2P/CUMEM",
    W + "Channel 03/0 : 7[3] -> 3[3] [receive] via NET/IBext_v8/3/GDRDMA",
    W + "32 coll channels, 32 collnet channels, 16 nvls channels, 32 p2p channels, 32 p2p channels per peer",
]


def _log(lines: list[str]) -> str:
    return "\n".join(["INFO 12-01 10:00:00 [core.py:90] Initializing a V1 LLM engine", *lines]) + "\n"


def _facts(ib: str = "") -> dict[str, Any]:
    """host_facts from the gpu_facts role's raw `ib` output (DEVICE PORT RATE STATE, tab-separated)."""
    return host_facts({"ib": ib})


IB_ACTIVE = "mlx5_0\t1\t400 Gb/sec (4X NDR)\t4: ACTIVE\nmlx5_1\t1\t400 Gb/sec (4X NDR)\t4: ACTIVE\n"
IB_DOWN = "mlx5_0\t1\t10 Gb/sec (4X SDR)\t1: DOWN\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (IB_GDR, ("IB", True, "P2P", ["mlx5_0:1", "mlx5_1:1"])),
        (SOCKET_FALLBACK, ("Socket", False, "P2P", [])),
        (ROCE, ("RoCE", False, "SHM", ["mlx5_10:1", "mlx5_11:1"])),
        (IBEXT, ("IB", True, "NVLS", ["ibp0:1", "ibp1:1"])),
        ([], (None, False, None, [])),
    ],
    ids=["ib-gdrdma", "socket-fallback", "roce", "ibext-plugin-nvls", "no-nccl-lines"],
)
def test_parse(lines: list[str], expected: tuple[Any, ...]) -> None:
    got = nccl.parse(_log(lines))
    assert (got["inter_node"], got["gdrdma"], got["intra_node"], got["rdma_devices"]) == expected


def test_one_socket_channel_among_rdma_ones_is_a_fallback() -> None:
    lines = [*IB_GDR, W + "Channel 05/0 : 0[0] -> 2[0] [send] via NET/Socket/0"]
    got = nccl.parse(_log(lines))
    assert got["inter_node"] == "Socket" and got["inter_node_channels"] == 3


def test_without_connection_lines_nccls_choice_counts() -> None:
    lines = [
        "axa:3048391:3048566 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.",
        "axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
        "axa:3048391:3048566 [0] NCCL INFO Using network Socket",
    ]
    got = nccl.parse(_log(lines))
    assert (got["inter_node"], got["inter_node_channels"]) == ("Socket", 0)
    # and a NET/Socket "Using" line alone (printed beside IB as well) is not a choice
    assert nccl.parse(_log(lines[1:2]))["inter_node"] is None


def test_intra_node_prefers_nvls_then_p2p_then_shm() -> None:
    p2p_shm = [W + "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct", W + "Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM"]
    assert nccl.parse(_log(p2p_shm))["intra_node"] == "P2P"
    assert nccl.parse(_log(p2p_shm[:1]))["intra_node"] == "SHM"
    nvls = W + "16 coll channels, 0 collnet channels, 8 nvls channels, 16 p2p channels, 2 p2p channels per peer"
    assert nccl.parse(_log([*p2p_shm, nvls]))["intra_node"] == "NVLS"
    no_nvls = W + "16 coll channels, 0 collnet channels, 0 nvls channels, 16 p2p channels, 2 p2p channels per peer"
    assert nccl.parse(_log([no_nvls]))["intra_node"] is None


def test_gdr_from_the_ring_summary_counts_only_on_rdma() -> None:
    ring = W + "Connected all rings, use ring PXN 0 GDR 1"
    assert nccl.parse(_log([*ROCE, ring]))["gdrdma"] is True
    assert nccl.parse(_log([*SOCKET_FALLBACK, ring]))["gdrdma"] is False


def test_socket_fallback_on_a_node_with_ib_fails_with_the_fix() -> None:
    result = nccl.check(nccl.parse(_log(SOCKET_FALLBACK)), _facts(IB_ACTIVE), "node2")
    assert result.status == FAIL
    assert result.detail == (
        "node2: NCCL fell back to sockets (NET/Socket) though the node has active RDMA port(s) mlx5_0:1, mlx5_1:1"
    )
    assert result.fix == "check NCCL_IB_HCA, /dev/infiniband in the container, memlock"


@pytest.mark.parametrize("ib", ["", IB_DOWN], ids=["no-ib", "ib-port-down"])
def test_sockets_without_an_active_ib_port_are_fine(ib: str) -> None:
    result = nccl.check(nccl.parse(_log(SOCKET_FALLBACK)), _facts(ib))
    assert result.status == PASS and "NET/Socket" in result.detail


def test_ib_as_promised() -> None:
    result = nccl.check(nccl.parse(_log(IB_GDR)), _facts(IB_ACTIVE))
    assert (result.status, result.detail) == (PASS, "NET/IB/GDRDMA over mlx5_0:1, mlx5_1:1")


def test_rdma_without_gdr_or_without_facts_warns() -> None:
    roce = nccl.check(nccl.parse(_log(ROCE)), _facts(IB_ACTIVE))
    assert roce.status == WARN and "NET/RoCE over mlx5_10:1, mlx5_11:1 without GPUDirect RDMA" in roce.detail
    unlisted = nccl.check(nccl.parse(_log(IB_GDR)), _facts(""))
    assert unlisted.status == WARN and "facts list no active IB/RoCE port" in unlisted.detail


def test_no_inter_node_traffic_is_skipped() -> None:
    single = [W + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"]
    result = nccl.check(nccl.parse(_log(single)), _facts(IB_ACTIVE))
    assert result.status == SKIP


def test_verdict_is_ok_unless_failed() -> None:
    failed = nccl.verdict(_log(SOCKET_FALLBACK), _facts(IB_ACTIVE), "node2")
    assert failed["ok"] is False and failed["check"]["status"] == FAIL
    assert failed["transport"]["inter_node"] == "Socket"
    assert nccl.verdict(_log(SOCKET_FALLBACK), _facts(""))["ok"] is True


def test_the_ansible_filter() -> None:
    pytest.importorskip("ansible")
    from ansible.errors import AnsibleFilterError

    from tests.conftest import filter_plugins

    check = filter_plugins()["vllm_fleet_nccl_check"]
    got = check(_log(SOCKET_FALLBACK), _facts(IB_ACTIVE), "node2")
    assert got == nccl.verdict(_log(SOCKET_FALLBACK), _facts(IB_ACTIVE), "node2") and got["ok"] is False
    assert check(_log(IB_GDR), _facts(IB_ACTIVE))["check"]["status"] == PASS
    assert check(None)["check"]["status"] == SKIP  # no log: nothing to check
    with pytest.raises(AnsibleFilterError, match="facts must be the node's gpu_facts dict"):
        check(_log(IB_GDR), ["mlx5_0"])
