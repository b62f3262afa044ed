"""Property-based fuzzing of topology documents and the files a scenario takes (issue 11, item 6): valid
documents load and plan, mutated or broken ones are refused in one line (SpecError / UsageError), through the loader
and through the CLI. Shared pieces and the rules every fuzz test keeps: tests/unit/fuzzkit.py."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.errors import UsageError
from topologies import (DumbbellSpec, LeafSpineSpec, SpecError, from_dict, load_topology, loads_toml,
                        loads_yaml)
from tests.unit.fuzzkit import (FUZZ, SCENARIOS, ARGV_CHARS, PRINTABLE, assert_refused_by_cli, examples,
                                 guarded, no_namespace_created, one_line, outcome)

__all__ = ["guarded", "no_namespace_created"]  # fixtures, used by name

# ---- topology documents ------------------------------------------------------------------------------------------

_RATES = st.sampled_from([0.01, 0.5, 1, 10, 20.0, 100, 1000, 40000, 100_000])


@st.composite
def link_doc(draw, mtu: st.SearchStrategy[int]) -> dict:
    d = {"rate_mbps": draw(_RATES | st.floats(0.01, 100_000))}
    if draw(st.booleans()):
        delay = draw(st.sampled_from([0, 0.05, 1, 10.0, 10_000]))
        d["delay_ms"] = delay
        if draw(st.booleans()):
            d["jitter_ms"] = draw(st.floats(0, delay))
    if draw(st.booleans()):
        d["loss_percent"] = draw(st.sampled_from([0, 0.1, 1, 50, 100]))
    d["mtu"] = draw(mtu)
    return d


@st.composite
def queue_doc(draw, frame: int) -> dict:
    """A queue that holds at least one frame of ``frame`` bytes."""
    disc = draw(st.sampled_from(["droptail", "red", "step"]))
    buf = draw(st.integers(max(frame, 20_000), 4_000_000))
    if disc == "droptail":
        if draw(st.booleans()):
            return {"discipline": disc, "buffer_packets": draw(st.integers(max(7, -(-frame // 1500)), 10_000))}
        return {"discipline": disc, "buffer_bytes": buf}
    if disc == "red":
        lo = draw(st.integers(1, buf - 1))
        hi = draw(st.integers(lo + 1, buf))
        d = {"discipline": disc, "buffer_bytes": buf, "min_bytes": lo, "max_bytes": hi,
             "probability": draw(st.sampled_from([0.01, 0.1, 1.0])), "ecn": draw(st.booleans())}
        if draw(st.booleans()):
            d["burst_packets"] = draw(st.integers(1, 100))
        return d
    return {"discipline": disc, "buffer_bytes": buf, "k_bytes": draw(st.integers(1, buf - 1))}


def tcp_doc() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={
        "congestion_control": st.sampled_from(["cubic", "reno", "bbr"]),
        "rto_min_ms": st.integers(1, 120_000),
        "tcp_rmem_bytes": st.just([4096, 131072, 6291456]),
    })


@st.composite
def classes_doc(draw, frame: int) -> list[dict]:
    n = draw(st.integers(0, 3))
    if n == 0:
        return []
    out = []
    for i in range(n):
        c = {"name": f"c{i}", "dscp": [i * 8, i * 8 + 1], "default": i == 0}
        if draw(st.booleans()):
            c["priority"] = i
        else:
            c["weight"] = draw(st.integers(1, 1000))
        if i > 0 and draw(st.booleans()):
            c.update(lossless=True, pcp=i, xoff_bytes=10_000, xon_bytes=5_000, headroom_bytes=5_000,
                     queue={"discipline": "droptail", "buffer_bytes": max(frame, 20_000)})
        out.append(c)
    return out


@st.composite
def valid_topology_doc(draw) -> dict:
    """A document that must load: small fabrics, values inside every documented range."""
    kind = draw(st.sampled_from(["leafspine", "dumbbell"]))
    host_mtu = draw(st.sampled_from([576, 1500, 4000, 9000]))
    edge = draw(link_doc(st.just(host_mtu)))
    core = draw(link_doc(st.sampled_from([m for m in (1500, 9000) if m >= host_mtu])))
    frame = max(edge["mtu"], core["mtu"]) + 14
    doc: dict = {"kind": kind} if kind == "dumbbell" or draw(st.booleans()) else {}
    if kind == "leafspine":
        doc.update(spines=draw(st.integers(1, 3)), leaves=draw(st.integers(1, 4)),
                   hosts_per_leaf=draw(st.integers(1, 4)), host_link=edge, fabric_link=core)
        qfields = ["host_queue", "leaf_down_queue", "leaf_up_queue", "spine_queue"]
        if draw(st.booleans()):
            doc["load_balancing"] = draw(st.sampled_from(["ecmp", "spray"]))
    else:
        doc.update(senders=draw(st.integers(1, 6)), sender_link=edge, bottleneck_link=core)
        if draw(st.booleans()):
            doc["receivers"] = draw(st.integers(1, 3))
        if draw(st.booleans()):
            doc["receiver_link"] = draw(link_doc(st.just(host_mtu)))
        qfields = ["bottleneck_queue", "switch_queue", "host_queue"]
    for q in qfields:
        if draw(st.booleans()):
            doc[q] = draw(queue_doc(frame))
    classes = draw(classes_doc(frame))
    if classes:
        doc["classes"] = classes
        for q in qfields:  # a lossless class on a tier queue: that queue must not drop early and must fit it
            if q in doc and (doc[q]["discipline"] == "red" and not doc[q]["ecn"]
                             or doc[q].get("buffer_bytes", 10**9) < 20_000):
                doc[q] = {"discipline": "droptail", "buffer_bytes": 262_144}
    if draw(st.booleans()):
        doc["tcp"] = draw(tcp_doc())
    if draw(st.booleans()):
        doc["seed"] = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        doc["prefix"] = draw(st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True))
    return doc


_WRONG = st.sampled_from([None, True, False, -1, 0, -5.5, 10**12, 1e308, float("inf"), float("nan"), "", "x",
                          "10", "1K", [], [1], {}, {"a": 1}, "a\nb", ["a\nb"]])


@st.composite
def mutated_doc(draw) -> object:
    """A valid document with one to three mutations at random places of its tree."""
    doc = draw(valid_topology_doc())
    for _ in range(draw(st.integers(1, 3))):
        doc = _mutate(draw, doc)
    return doc


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _mutate(draw, doc):
    path = draw(st.sampled_from(list(_paths(doc))))
    op = draw(st.sampled_from(["wrong", "wrong", "negative", "unknown_key", "delete", "nest", "unnest", "kind",
                               "rename"]))
    if not path:
        if op == "kind":
            return {**doc, "kind": draw(st.sampled_from(["LeafSpine", "fattree", "", 1, None, ["dumbbell"]]))} \
                if isinstance(doc, dict) else doc
        return draw(_WRONG) if op == "wrong" else [doc] if op == "nest" else doc
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key, value = path[-1], parent[path[-1]]
    if op == "wrong":
        parent[key] = draw(_WRONG)
    elif op == "negative" and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = -value if value else -1
    elif op == "unknown_key" and isinstance(value, dict):
        value[draw(st.sampled_from(["rate", "Rate_mbps", "bogus", "", "a\nb", "mtu "]))] = 1
    elif op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "nest":
        parent[key] = {"value": value} if draw(st.booleans()) else [value]
    elif op == "unnest" and isinstance(value, dict) and value:
        parent[key] = next(iter(value.values()))
    elif op == "rename" and isinstance(parent, dict):
        parent[draw(st.sampled_from([f"{key}s", str(key).upper(), f"{key}_", "x" + str(key)]))] = parent.pop(key)
    return doc


def _toml_value(v) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(type(v))


def _toml_key(k) -> str:
    import json

    return json.dumps(str(k))


def to_toml(doc: dict) -> str:
    """TOML text of a document (top-level keys, nested values inline; None is left out: TOML has no null)."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in doc.items() if v is not None)


def check_plan(spec) -> None:
    """The derived plan a builder consumes evaluates without exception."""
    assert isinstance(spec, (LeafSpineSpec, DumbbellSpec))
    nodes, links = spec.nodes, spec.links
    assert nodes and links
    spec.addresses
    spec.routes
    assert len(spec.egress_ports()) == 2 * len(links)
    spec.describe()


def load_outcome(load, arg):
    try:
        spec = load(arg)
    except SpecError as e:
        one_line(str(e))
        return e
    check_plan(spec)
    return spec


@settings(max_examples=examples(60), **FUZZ)
@given(doc=valid_topology_doc(), fmt=st.sampled_from(["dict", "toml", "yaml"]))
def test_valid_topology_documents_load_and_plan(doc, fmt):
    import yaml

    if fmt == "dict":
        r = load_outcome(from_dict, doc)
    elif fmt == "toml":
        r = load_outcome(loads_toml, to_toml(doc))
    else:
        r = load_outcome(loads_yaml, yaml.safe_dump(doc))
    assert not isinstance(r, SpecError), f"{doc!r} refused: {r}"


@settings(max_examples=examples(150), **FUZZ)
@given(doc=mutated_doc(), fmt=st.sampled_from(["dict", "toml", "yaml"]))
def test_mutated_topology_documents_load_or_refuse_in_one_line(doc, fmt):
    import yaml

    if fmt == "dict":
        load_outcome(from_dict, doc)
    elif fmt == "toml":
        if not isinstance(doc, dict):
            return
        load_outcome(loads_toml, to_toml(doc))
    else:
        load_outcome(loads_yaml, yaml.safe_dump(doc))


_SYNTAX = st.sampled_from(["[", "]]", "=", "spines = ", "spines = 2\nspines = 3", "[host_link\n", "a.b.c = 1",
                           "{", "- x", ": :", "key: [1, 2", "'", '"', "\t", "!!python/object:os.system x",
                           "&a [*a]", "spines: &x 1\nleaves: *x", "---\n---", "\x7f", "\ufeff", "\\", "1979-05-27",
                           "[[classes]]\nname = 'x'", "kind = 'dumbbell'\n[[classes]]", "%YAML 9.9\n---"])


@settings(max_examples=examples(80), **FUZZ)
@given(parts=st.lists(_SYNTAX | st.text(ARGV_CHARS.filter(lambda c: c not in "\udc80\udcff"), max_size=30),
                      max_size=5),
       valid=st.none() | valid_topology_doc(), fmt=st.sampled_from(["toml", "yaml"]))
def test_broken_syntax_is_one_line(parts, valid, fmt):
    import yaml

    base = "" if valid is None else (to_toml(valid) if fmt == "toml" else yaml.safe_dump(valid))
    text = base + "\n".join(parts)
    load_outcome(loads_toml if fmt == "toml" else loads_yaml, text)


@settings(max_examples=examples(20), **FUZZ)
@given(doc=st.none() | mutated_doc(), suffix=st.sampled_from([".toml", ".yaml", ".yml", ".json", "", ".TOML"]),
       name=st.sampled_from(["topo", "a b", "new\nline", "t\u00e9"]))
def test_topology_files_load_or_refuse_in_one_line(tmp_path, doc, suffix, name):
    import yaml

    path = tmp_path / f"{name}{suffix}"
    if doc is not None and isinstance(doc, dict):
        path.write_text(to_toml(doc) if suffix.lower() == ".toml" else yaml.safe_dump(doc), encoding="utf-8")
    elif doc is not None:
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    load_outcome(load_topology, path)


def test_topology_file_unreadable_is_one_line(tmp_path):
    for p in (tmp_path / "missing.toml", tmp_path, tmp_path / "bin.toml", tmp_path / "bin.yaml"):
        if p.name.startswith("bin"):
            p.write_bytes(b"\xff\xfe\x00garbage")
        r = load_outcome(load_topology, p)
        assert isinstance(r, SpecError) and str(p) in str(r), (p, r)


# ---- files given to a scenario, through the CLI ------------------------------------------------------------------


def _file_params() -> list[tuple[str, str]]:
    """(scenario, parameter) of every parameter that names a file (free text ending in _file, or a topology
    parameter without fixed choices)."""
    return [(s.name, p.name) for s in SCENARIOS.values() for p in s.params
            if p.kind is str and not p.choices and (p.name.endswith("_file") or "topology" in p.name)]


@settings(max_examples=examples(15), **FUZZ)
@given(content=st.sampled_from(["", "{", "[]", "null", '{"ranks": 2}', "garbage\n", '{"format": "x"}',
                                "\xff"]) | st.text(PRINTABLE, max_size=40),
       where=st.sampled_from(["file", "missing", "dir"]))
def test_cli_refuses_bad_scenario_files(guarded, capsys, tmp_path_factory, content, where):
    """The files a scenario takes: collective's schedule_file and topology_file (incast's `topology` is a shape,
    leafspine|dumbbell). A bad one is one line, exit 2, nothing built; a topology file path where a shape is
    expected is refused the same way."""
    d = tmp_path_factory.mktemp("files")
    topo = d / "topo.toml"
    topo.write_text("spines = -1\n")
    assert_refused_by_cli(capsys, ["run", "incast", "--set", f"topology={topo}"])
    for scn, name in _file_params():
        path = d / f"{scn}-{name}{'.toml' if 'topology' in name else '.json'}"  # the suffix its loader reads
        if where == "file":
            path.write_text(content, encoding="utf-8", errors="surrogateescape")
        elif where == "dir":
            path.mkdir()
        r = outcome(scn, [f"{name}={path}"])
        if not isinstance(r, UsageError):
            continue  # a content that happens to be a valid file: never run it
        assert_refused_by_cli(capsys, ["run", scn, "--set", f"{name}={path}"], reason=str(r))


# ---- dcqcn with a topology file: checked at the rate and on the queues the install will find ----------------------

DCQCN_TOPOLOGY = """kind = "leafspine"
spines = 1
leaves = 2
hosts_per_leaf = 2

[host_link]
rate_mbps = 20

[fabric_link]
rate_mbps = 20

[leaf_down_queue]
discipline = "step"
buffer_bytes = 100000
k_bytes = 20000
"""


def _dcqcn_outcome(tmp_path, extra: str, *sets: str) -> dict | UsageError:
    (tmp_path / "topo.toml").write_text(DCQCN_TOPOLOGY + extra)
    return outcome("collective", ["transport=rdma", "rdma_timeout=20", "dcqcn=on",
                                  f"topology_file={tmp_path / 'topo.toml'}", *sets])


def test_dcqcn_min_rate_is_checked_against_a_host_port_rate_override(tmp_path):
    assert isinstance(_dcqcn_outcome(tmp_path, "", "dcqcn_min_rate_mbps=8"), dict)  # under 20 Mbit/s: fine
    slow = '\n[[ports]]\nport = "h1:eth0"\nrate_mbps = 5\n'  # h1's NIC at 5: DCQCN runs at the slowest host NIC
    r = _dcqcn_outcome(tmp_path, slow, "dcqcn_min_rate_mbps=8")
    assert isinstance(r, UsageError) and "min_rate_kbps" in str(r), r


def test_dcqcn_on_refuses_host_nic_queues_fq_could_not_put_back(tmp_path):
    red = ('\n[host_queue]\ndiscipline = "red"\nbuffer_bytes = 100000\nmin_bytes = 20000\nmax_bytes = 60000\n'
           'probability = 0.1\necn = true\n')
    r = _dcqcn_outcome(tmp_path, red)
    assert isinstance(r, UsageError) and "drop-tail host NIC queues" in str(r) and "red" in str(r), r
    assert isinstance(_dcqcn_outcome(tmp_path, red, "dcqcn=mark"), dict)  # mark leaves the host queues alone
