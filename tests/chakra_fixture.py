"""A Chakra execution trace writer of the tests' own, from the published schema (et_def.proto): length-delimited
GlobalMetadata then Nodes, independent of traffic.traces' reader."""

from __future__ import annotations

import struct


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num: int, wt: int, payload) -> bytes:
    key = varint(num << 3 | wt)
    if wt == 0:
        return key + varint(payload)
    if wt == 1:
        return key + struct.pack("<d", payload)
    return key + varint(len(payload)) + payload


def attr(name: str, **kw) -> bytes:
    body = field(1, 2, name.encode())
    for k, v in kw.items():
        body += {"int64": lambda x: field(9, 0, x), "uint64": lambda x: field(13, 0, x),
                 "string": lambda x: field(29, 2, x.encode()), "double": lambda x: field(3, 1, x),
                 "bool": lambda x: field(27, 0, int(x))}[k](v)
    return body


def node(nid: int, name: str, ntype: int, deps=(), duration_us=0, attrs=(), packed=True) -> bytes:
    body = field(1, 0, nid) + field(2, 2, name.encode()) + field(3, 0, ntype)
    if deps:
        if packed:
            body += field(5, 2, b"".join(varint(d) for d in deps))  # data_deps, packed
        else:
            body += b"".join(field(4, 0, d) for d in deps)  # ctrl_deps, one by one
    if duration_us:
        body += field(7, 0, duration_us)
    for a in attrs:
        body += field(10, 2, a)
    return body


def et(*nodes, version="0.0.4") -> bytes:
    msgs = [field(1, 2, version.encode()) + field(2, 2, attr("schema", string="test")), *nodes]
    return b"".join(varint(len(m)) + m for m in msgs)


COMP, COLL, SEND = 4, 7, 5
ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, SCATTER, BARRIER = 0, 2, 6, 4, 9


def small_chakra() -> bytes:
    """fwd (2 ms) -> grad all-reduce 64 KiB; (bwd 3 ms, unpacked ctrl dep) -> all-gather 8 KiB; a barrier; the
    optimizer (0.5 ms) last. Listed out of order: the reader walks dependencies."""
    return et(
        node(5, "barrier", COLL, deps=[4], attrs=[attr("comm_type", int64=BARRIER)]),
        node(1, "fwd", COMP, duration_us=2000),
        node(2, "grads", COLL, deps=[1], attrs=[attr("comm_type", int64=ALL_REDUCE), attr("comm_size", int64=65536),
                                                   attr("is_cpu_op", bool=False)]),
        node(3, "bwd", COMP, deps=[2], duration_us=3000, packed=False),
        node(4, "params", COLL, deps=[3], attrs=[attr("comm_type", uint64=ALL_GATHER),
                                                    attr("comm_size", uint64=8192)]),
        node(6, "opt", COMP, deps=[5], duration_us=500),
        node(7, "meta", 1))
