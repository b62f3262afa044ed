"""Pure logic of the RDMA transport and the collective scenario's rdma parameters (no RDMA device needed)."""

from __future__ import annotations

import pytest

from testbed.errors import CapabilityMissing, UsageError
from testbed.scenario import get
from traffic import rdma
from traffic.agent import make_transport

COLL = get("collective")


def params(**kw):
    p = {x.name: x.default for x in COLL.params}
    p.update(kw)
    return p


def test_rxe_mtu_follows_the_netdev_mtu():
    # rxe: netdev MTU minus 80 header bytes, rounded down to an IB MTU
    assert rdma.rxe_mtu_for_netdev(1500) == 1024
    assert rdma.rxe_mtu_for_netdev(1104) == 1024
    assert rdma.rxe_mtu_for_netdev(1103) == 512
    assert rdma.rxe_mtu_for_netdev(2128) == 2048
    assert rdma.rxe_mtu_for_netdev(9000) == 4096
    assert rdma.rxe_mtu_for_netdev(500) == 256


def test_ipv4_gid_is_the_mapped_address():
    assert rdma.ipv4_gid("198.18.1.1") == "0000:0000:0000:0000:0000:ffff:c612:0101"


def test_wire_formats_fit_a_control_slot():
    from traffic import rdma_connect, rdma_credits

    assert rdma.CTS.size <= rdma.CTL_SLOT and rdma_credits.CREDIT.size <= rdma.CTL_SLOT
    assert rdma_credits.HDR.size <= rdma_credits.HDR_BYTES == rdma.CTL_SLOT  # a piece's header is one control slot
    assert rdma_connect.INFO.size == 56


def test_rdma_mtu_validation_is_one_line():
    COLL.validate(params(transport="rdma"))
    COLL.validate(params(transport="rdma", rdma_mtu=1024))
    with pytest.raises(UsageError, match=r"^rdma_mtu: 2048 does not fit the host links' MTU 1500"):
        COLL.validate(params(transport="rdma", rdma_mtu=2048))
    with pytest.raises(UsageError, match=r"^rdma_mtu: must be 0 or one of 256, 512, 1024, 2048, 4096"):
        COLL.validate(params(transport="rdma", rdma_mtu=1000))
    with pytest.raises(UsageError, match="transport: must be one of tcp, rdma"):
        next(x for x in COLL.params if x.name == "transport").parse("roce")
    with pytest.raises(UsageError, match="loss_host: unknown host"):
        COLL.validate(params(loss_percent=1.0, loss_host="h9"))


def test_rdma_without_rxe_names_the_capability(monkeypatch, tmp_path):
    from testbed.kernel import doctor
    from testbed.commands.runner import run_scenario

    monkeypatch.setattr(doctor, "missing", lambda names: [n for n in names if n == "rxe:netns"])
    built = []
    import testbed.network.fabric

    monkeypatch.setattr(testbed.network.fabric.Fabric, "build", lambda *a, **k: built.append(1))
    with pytest.raises(CapabilityMissing) as ei:
        run_scenario(COLL, params(transport="rdma"), 1, tmp_path / "run", quiet=True)
    assert "rxe:netns" in str(ei.value) and "\n" not in str(ei.value)
    assert ei.value.exit_status == 2 and not built and not (tmp_path / "run").exists()


def test_transport_options_are_checked_before_any_device_is_opened():
    with pytest.raises(ValueError, match="mtu must be one of"):
        make_transport("rdma", 0, ip="198.18.1.1", mtu=1000)
    with pytest.raises(ValueError, match="retry_cnt must be 0..7"):
        make_transport("rdma", 0, ip="198.18.1.1", retry_cnt=9)
    with pytest.raises(ValueError, match="credits must be 0..64"):
        make_transport("rdma", 0, ip="198.18.1.1", credits=65)
    with pytest.raises(ValueError, match="slot_bytes must be"):
        make_transport("rdma", 0, ip="198.18.1.1", slot_bytes=100)
    with pytest.raises(ValueError, match="recv_depth >= 2 x credits"):
        make_transport("rdma", 0, ip="198.18.1.1", credits=64, recv_depth=64)
    with pytest.raises(ValueError, match="protocol must be one of eager, rendezvous, grant"):
        make_transport("rdma", 0, ip="198.18.1.1", protocol="ring")
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("ib", 0)
