"""The DCQCN loader's pure parts: its ctypes mirrors of the programs' map structs equal the compiled object's BTF
(size, every member's name and offset: a field added on one side only fails here, not as garbage rates in a run),
and the pairing of QPs across hosts from the RDMA netlink tables. Compiling needs clang; reading the BTF uses
libbpf's parser on the object file (no kernel involved)."""

from __future__ import annotations

import ctypes

import pytest

from testbed.kernel import dcqcn, rdma_qps
from testbed.kernel.ebpf import compile_object, lib
from testbed.kernel.rdma_qps import QPS_RTS, QPT_RC, Qp, pair_qps

BTF_KIND_STRUCT = 4


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _BtfMember(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32), ("offset", ctypes.c_uint32)]


def btf_struct(name: str) -> tuple[int, list[tuple[str, int]]]:
    """(size, [(member, byte offset)]) of struct `name` in dcqcn.bpf.c's object, from its BTF."""
    L = lib()
    for fn, res, args in (("btf__parse_elf", ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p]),
                          ("btf__find_by_name_kind", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]),
                          ("btf__type_by_id", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_uint32]),
                          ("btf__name_by_offset", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_uint32]),
                          ("btf__free", None, [ctypes.c_void_p])):
        getattr(L, fn).restype, getattr(L, fn).argtypes = res, args
    btf = L.btf__parse_elf(str(compile_object(dcqcn.SOURCE)).encode(), None)
    assert btf, "no BTF in the object"
    try:
        tid = L.btf__find_by_name_kind(btf, name.encode(), BTF_KIND_STRUCT)
        assert tid > 0, f"struct {name} not in the BTF"
        addr = L.btf__type_by_id(btf, tid)
        t = _BtfType.from_address(addr)
        members = (_BtfMember * (t.info & 0xFFFF)).from_address(addr + ctypes.sizeof(_BtfType))
        return t.size, [(L.btf__name_by_offset(btf, m.name_off).decode(), m.offset // 8) for m in members]
    finally:
        L.btf__free(btf)


@pytest.mark.parametrize("cname, mirror", [("dcqcn_config", dcqcn.Config), ("qp_peer", dcqcn.QpPeer),
                                           ("rp_key", dcqcn.RpKey), ("rp_state", dcqcn.RpState)])
def test_the_ctypes_mirrors_match_the_programs_structs(cname, mirror):
    size, members = btf_struct(cname)
    assert ctypes.sizeof(mirror) == size
    assert [(n, getattr(mirror, n).offset) for n, _ in mirror._fields_] == members


def test_the_loader_names_the_stats_in_the_programs_order():
    text = dcqcn.SOURCE.read_text()
    enum = text[text.index("enum { S_CE_SEEN"):text.index("S_NSTATS")]
    names = [w.strip().removeprefix("S_").lower() for w in enum.removeprefix("enum {").split(",") if w.strip()]
    assert [n.replace("paced", "paced_packets") for n in names] == list(dcqcn.STATS)


def qp(lqpn, rqpn, state=QPS_RTS, qp_type=QPT_RC):
    return Qp("rxe", lqpn, rqpn, qp_type, state, None)


def test_qps_are_paired_with_the_host_whose_table_has_the_mirror_entry():
    tables = {"10.0.0.1": [qp(17, 18), qp(19, 20), qp(21, None, state=1)],
              "10.0.0.2": [qp(18, 17), qp(20, 19), qp(1, 0, qp_type=4)]}
    assert pair_qps(tables) == {"10.0.0.1": [(17, 18, "10.0.0.2"), (19, 20, "10.0.0.2")],
                                "10.0.0.2": [(18, 17, "10.0.0.1"), (20, 19, "10.0.0.1")]}


def test_an_ambiguous_pair_is_left_out_rather_than_guessed():
    tables = {"a": [qp(17, 17)], "b": [qp(17, 17)], "c": [qp(17, 17)]}
    assert pair_qps(tables) == {"a": [], "b": [], "c": []}
    # two hosts: the same numbers on both sides are one pair, not ambiguous
    assert pair_qps({"a": [qp(17, 17)], "b": [qp(17, 17)]}) == {"a": [(17, 17, "b")], "b": [(17, 17, "a")]}


def test_netlink_attributes_are_parsed_with_padding_and_nested_flags():
    import struct
    buf = struct.pack("=HHI", 8, rdma_qps.ATTR_RES_LQPN, 17) + struct.pack("=HH5sxxx", 9, rdma_qps.ATTR_DEV_NAME,
                                                                           b"rxe0\0")
    buf += struct.pack("=HH", 4, 0x8000 | rdma_qps.ATTR_RES_QP)
    assert rdma_qps._attrs(buf) == [(rdma_qps.ATTR_RES_LQPN, struct.pack("=I", 17)),
                                    (rdma_qps.ATTR_DEV_NAME, b"rxe0\0"), (rdma_qps.ATTR_RES_QP, b"")]
