"""Workload traces from the simulators' world, read into what the testbed runs: a Chakra execution trace (MLCommons'
protobuf format, read here from its published schema, et_def.proto) or an ASTRA-sim / SimAI text workload. Their
communication nodes become collective ops with testbed schedules; their compute nodes become compute gaps before
the next op, so an emulated step can be set beside the step a simulator predicts for the same trace.

    trace = load_trace("workload.0.et")          # or "resnet.txt": the format is recognised from the content
    trace.ops                                     # (TraceOp(name, collective, size_bytes, compute_before_ms), ...)

What is kept, and what is not (docs/programs.md#traces):

* **Chakra** (one rank's ``.et`` file; every rank is taken to run the same graph, as in data parallelism): a file is
  a sequence of messages, each preceded by its length as a varint: one ``GlobalMetadata``, then ``Node``s. Nodes are
  walked in dependency order (data and control deps; ties by id). ``COMP_NODE``: its ``duration_micros`` adds to the
  compute gap; ``COMM_COLL_NODE``: one op, collective from the ``comm_type`` attribute (CollectiveCommType), size
  from ``comm_size`` (bytes, each rank's buffer). Point-to-point nodes (``COMM_SEND_NODE``/``COMM_RECV_NODE``) are
  refused (no peer mapping across ranks' files is read); metadata, memory, storage and checkpoint nodes are skipped.
* **ASTRA-sim text** (the 1.0 workload format SimAI also writes): line 1 the parallelism (``DATA``, ``HYBRID_*``,
  possibly with ``key: value`` settings), line 2 the number of layers, then per layer: name, reserved, forward
  compute, forward comm type, forward comm size, input-grad compute, type, size, weight-grad compute, type, size,
  update delay (compute in cycles, read as ns at 1 GHz; sizes in bytes). One training step = forward through the
  layers, then backward in reverse order (input-grad then weight-grad of each layer), each comm after its compute.
  Communication is run blocking (exposed): the overlap a simulator may model is not.

Errors are :class:`TraceError`, one line naming the file, the record and what is wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

#: Chakra NodeType values (et_def.proto)
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
NODE_TYPES = {0: "INVALID_NODE", 1: "METADATA_NODE", 2: "MEM_LOAD_NODE", 3: "MEM_STORE_NODE", 4: "COMP_NODE",
              5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE", 7: "COMM_COLL_NODE", 8: "STORAGE_NODE", 9: "BATCH_NODE",
              10: "CHECKPOINT_NODE"}
#: Chakra CollectiveCommType -> the testbed's collective (None: refused, named)
CHAKRA_COLLECTIVES = {0: "allreduce", 1: "reduce", 2: "allgather", 3: "gather", 4: None, 5: "broadcast",
                      6: "alltoall", 7: "reducescatter", 8: "reducescatter", 9: "barrier"}
CHAKRA_COMM_NAMES = {0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER", 5: "BROADCAST",
                     6: "ALL_TO_ALL", 7: "REDUCE_SCATTER", 8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER"}
#: ASTRA-sim text comm types -> the testbed's collective
ASTRA_COLLECTIVES = {"ALLREDUCE": "allreduce", "ALLGATHER": "allgather", "ALLTOALL": "alltoall",
                     "ALLTOALLV": "alltoall", "REDUCESCATTER": "reducescatter"}
#: a barrier runs as the smallest all-reduce (what gloo and NCCL do)
BARRIER_BYTES = 4


class TraceError(ValueError):
    """A trace that cannot be read or run: one line."""


@dataclass(frozen=True)
class TraceOp:
    """One communication op of the trace: ``size_bytes`` is each rank's buffer, ``compute_before_ms`` the compute
    the trace puts between the previous op (or the step's start) and this one."""
    name: str
    collective: str
    size_bytes: int
    compute_before_ms: float


@dataclass(frozen=True)
class Trace:
    """One training step of a trace: its ops in order and the compute after the last one."""
    kind: str
    source: str
    ops: tuple[TraceOp, ...]
    compute_after_ms: float

    @property
    def compute_ms(self) -> float:
        return sum(o.compute_before_ms for o in self.ops) + self.compute_after_ms


def load_trace(path: str | Path) -> Trace:
    """A Chakra ``.et`` file or an ASTRA-sim text workload, recognised from its content (text that starts with a
    parallelism keyword, else Chakra's binary framing)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TraceError(f"trace_file: {e.strerror or e}: {p}") from None
    if not data.strip():
        raise TraceError(f"trace_file: {p} is empty")
    head = data[:64].lstrip()
    if head[:1].isalpha() and all(32 <= b < 127 or b in (9, 10, 13) for b in data[:4096]):
        return read_astrasim(data.decode("ascii", "replace"), str(p))
    return read_chakra(data, str(p))


# --------------------------------------------------------------------------- protobuf wire format

def _varint(buf: bytes, i: int, where: str) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise TraceError(f"{where}: truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise TraceError(f"{where}: varint longer than 10 bytes")


def fields(buf: bytes, where: str):
    """The (field number, wire type, value) of one message: value is an int (varint, fixed32, fixed64) or bytes
    (length-delimited). Groups (wire types 3, 4) and unknown wire types are errors."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i, where)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise TraceError(f"{where}: field number 0")
        if wt == 0:
            v, i = _varint(buf, i, where)
        elif wt == 1:
            if i + 8 > len(buf):
                raise TraceError(f"{where}: truncated 64-bit field {num}")
            v, i = struct.unpack_from("<Q", buf, i)[0], i + 8
        elif wt == 5:
            if i + 4 > len(buf):
                raise TraceError(f"{where}: truncated 32-bit field {num}")
            v, i = struct.unpack_from("<I", buf, i)[0], i + 4
        elif wt == 2:
            n, i = _varint(buf, i, where)
            if i + n > len(buf):
                raise TraceError(f"{where}: field {num} runs past the message end")
            v, i = buf[i:i + n], i + n
        else:
            raise TraceError(f"{where}: unsupported wire type {wt} (field {num})")
        yield num, wt, v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _attr_value(buf: bytes, where: str) -> tuple[str, object]:
    """An AttributeProto's name and scalar value (lists are kept as None)."""
    name, value = "", None
    for num, wt, v in fields(buf, where):
        if num == 1 and wt == 2:
            name = v.decode("utf-8", "replace")
        elif num in (7, 9) and wt == 0:  # int32_val, int64_val: two's complement varints
            value = _signed64(v)
        elif num in (11, 13) and wt == 0:  # uint32_val, uint64_val
            value = v
        elif num in (15, 17) and wt == 0:  # sint32_val, sint64_val: zigzag
            value = (v >> 1) ^ -(v & 1)
        elif num == 27 and wt == 0:
            value = bool(v)
        elif num == 3 and wt == 1:
            value = struct.unpack("<d", struct.pack("<Q", v))[0]
        elif num == 5 and wt == 5:
            value = struct.unpack("<f", struct.pack("<I", v))[0]
        elif num in (19, 21) and wt in (1, 5):
            value = v
        elif num == 29 and wt == 2:
            value = v.decode("utf-8", "replace")
    return name, value


def _deps(wt: int, v, where: str) -> list[int]:
    if wt == 0:
        return [v]
    out, i = [], 0  # packed repeated uint64
    while i < len(v):
        d, i = _varint(v, i, where)
        out.append(d)
    return out


@dataclass
class _Node:
    id: int = 0
    name: str = ""
    type: int = 0
    deps: tuple = ()
    duration_us: int = 0
    attrs: dict | None = None


def _node(buf: bytes, where: str) -> _Node:
    n, deps, attrs = _Node(), [], {}
    for num, wt, v in fields(buf, where):
        if num == 1 and wt == 0:
            n.id = v
        elif num == 2 and wt == 2:
            n.name = v.decode("utf-8", "replace")
        elif num == 3 and wt == 0:
            n.type = v
        elif num in (4, 5) and wt in (0, 2):
            deps += _deps(wt, v, where)
        elif num == 7 and wt == 0:
            n.duration_us = v
        elif num == 10 and wt == 2:
            k, val = _attr_value(v, f"{where} attribute")
            attrs[k] = val
    n.deps, n.attrs = tuple(deps), attrs
    return n


def read_chakra(data: bytes, source: str = "trace") -> Trace:
    """A Chakra execution trace (module docstring)."""
    msgs, i = [], 0
    while i < len(data):
        n, i = _varint(data, i, f"{source}: message {len(msgs)} length")
        if n == 0 or i + n > len(data):
            raise TraceError(f"{source}: message {len(msgs)} claims {n} bytes but {len(data) - i} remain "
                             "(not a Chakra execution trace, or truncated)")
        msgs.append(data[i:i + n])
        i += n
    first = list(fields(msgs[0], f"{source}: GlobalMetadata"))
    if not any(num == 1 and wt == 2 for num, wt, _ in first) or any(num not in (1, 2) for num, _, _ in first):
        raise TraceError(f"{source}: the first message is not a Chakra GlobalMetadata (no version string)")
    nodes = [_node(m, f"{source}: node message {k + 1}") for k, m in enumerate(msgs[1:])]
    if not nodes:
        raise TraceError(f"{source}: no nodes after the GlobalMetadata")
    return _chakra_ops(_topological(nodes, source), source)


def _topological(nodes: list[_Node], source: str) -> list[_Node]:
    import heapq

    by_id = {}
    for n in nodes:
        if n.id in by_id:
            raise TraceError(f"{source}: node id {n.id} appears twice")
        by_id[n.id] = n
    missing = sorted({d for n in nodes for d in n.deps if d not in by_id})
    if missing:
        raise TraceError(f"{source}: node(s) depend on missing node id(s) {', '.join(map(str, missing[:5]))}")
    indeg = {n.id: len(set(n.deps)) for n in nodes}
    children: dict[int, list[int]] = {}
    for n in nodes:
        for d in set(n.deps):
            children.setdefault(d, []).append(n.id)
    ready = [i for i, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(by_id[i])
        for c in children.get(i, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(nodes):
        raise TraceError(f"{source}: the dependencies have a cycle ({len(nodes) - len(order)} nodes on it)")
    return order


def _chakra_ops(order: list[_Node], source: str) -> Trace:
    ops, gap_us = [], 0
    for n in order:
        what = f"{source}: node {n.id} ({n.name or NODE_TYPES.get(n.type, n.type)})"
        if n.type == COMP_NODE:
            gap_us += n.duration_us
        elif n.type in (COMM_SEND_NODE, COMM_RECV_NODE):
            raise TraceError(f"{what}: point-to-point {NODE_TYPES[n.type]} is not supported (collectives only)")
        elif n.type == COMM_COLL_NODE:
            ctype = n.attrs.get("comm_type")
            if not isinstance(ctype, int) or ctype not in CHAKRA_COLLECTIVES:
                raise TraceError(f"{what}: comm_type attribute missing or unknown ({ctype!r})")
            coll = CHAKRA_COLLECTIVES[ctype]
            if coll is None:
                raise TraceError(f"{what}: {CHAKRA_COMM_NAMES[ctype]} has no testbed collective")
            size = n.attrs.get("comm_size")
            if coll == "barrier":
                coll, size = "allreduce", BARRIER_BYTES
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise TraceError(f"{what}: comm_size attribute missing or not a positive integer ({size!r})")
            ops.append(TraceOp(n.name or f"node{n.id}", coll, size, gap_us / 1000.0))
            gap_us = 0
        elif n.type not in NODE_TYPES:
            raise TraceError(f"{what}: unknown node type {n.type}")
    if not ops:
        raise TraceError(f"{source}: no collective communication node (COMM_COLL_NODE) to run")
    return Trace("chakra", source, tuple(ops), gap_us / 1000.0)


# --------------------------------------------------------------------------- ASTRA-sim text

def read_astrasim(text: str, source: str = "trace") -> Trace:
    """An ASTRA-sim / SimAI text workload (module docstring)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) < 3:
        raise TraceError(f"{source}: an ASTRA-sim workload needs a parallelism line, a layer count and layers")
    kind = lines[0][0]
    if not (kind == "DATA" or kind.startswith("HYBRID") or kind in ("MODEL", "MICRO", "DISTRIBUTED_INFERENCE")):
        raise TraceError(f"{source}: line 1: unknown parallelism {kind!r} (DATA, HYBRID_..., MODEL)")
    try:
        count = int(lines[1][0])
    except ValueError:
        raise TraceError(f"{source}: line 2: the layer count must be an integer (got {lines[1][0]!r})") from None
    layers = lines[2:]
    if count < 1 or count != len(layers):
        raise TraceError(f"{source}: line 2 says {count} layers but {len(layers)} layer lines follow")
    parsed = [_layer(row, k + 3, source) for k, row in enumerate(layers)]
    ops, gap_ns = [], 0.0

    def phase(name: str, compute_ns: float, ctype: str, size: int) -> None:
        nonlocal gap_ns
        gap_ns += compute_ns
        if ctype != "NONE" and size > 0:
            ops.append(TraceOp(name, ASTRA_COLLECTIVES[ctype], size, gap_ns / 1e6))
            gap_ns = 0.0

    for name, fwd, ig, wg, _ in parsed:
        phase(f"{name}.fwd", *fwd)
    for name, _, ig, wg, update in reversed(parsed):
        phase(f"{name}.ig", *ig)
        phase(f"{name}.wg", *wg)
        gap_ns += update
    if not ops:
        raise TraceError(f"{source}: no layer communicates (every comm type NONE or size 0)")
    return Trace("astra-sim", source, tuple(ops), gap_ns / 1e6)


def _layer(row: list[str], line: int, source: str):
    where = f"{source}: line {line}"
    if len(row) < 12:
        raise TraceError(f"{where}: a layer has 12 fields (name, reserved, 3 x (compute, comm type, comm size), "
                         f"update delay); got {len(row)}")

    def num(k: int, what: str) -> float:
        try:
            v = float(row[k])
        except ValueError:
            raise TraceError(f"{where}: {what} must be a number (got {row[k]!r})") from None
        if v < 0:
            raise TraceError(f"{where}: {what} must be >= 0 (got {row[k]})")
        return v

    def comm(k: int, what: str) -> tuple[float, str, int]:
        ctype = row[k + 1].upper().split("_")[0] if row[k + 1].upper() != "NONE" else "NONE"
        if ctype != "NONE" and ctype not in ASTRA_COLLECTIVES:
            raise TraceError(f"{where}: {what} comm type {row[k + 1]!r} is not one of NONE, "
                             f"{', '.join(ASTRA_COLLECTIVES)}")
        return num(k, f"{what} compute time"), ctype, int(num(k + 2, f"{what} comm size"))

    return row[0], comm(2, "forward"), comm(5, "input-grad"), comm(8, "weight-grad"), num(11, "update delay")
