"""The jobs file of `testbed jobs` (testbed.commands.jobsfile): read, checked and placed before anything is built;
every refusal is one line naming the entry. Pure: no root, no kernel."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed import scenario
from testbed.commands import jobsfile
from testbed.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
PARAMS = scenario.get("collective").params
FABRIC = """
[fabric]
spines = 1
leaves = 2
hosts_per_leaf = 3
host_rate_mbps = 20
fabric_rate_mbps = 20
"""
TWO_JOBS = FABRIC + """
[[job]]
name = "a"
size = "64K"
hosts = ["h1", "h2", "h4", "h5"]
iterations = 3

[[job]]
name = "b"
collective = "alltoall"
hosts = ["h3", "h6"]
"""


def load(tmp_path: Path, text: str):
    p = tmp_path / "jobs.toml"
    p.write_text(textwrap.dedent(text))
    return jobsfile.load(p, PARAMS, seed=1)


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(UsageError) as e:
        load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_two_jobs_on_their_hosts(tmp_path):
    jf = load(tmp_path, TWO_JOBS)
    a, b = jf.jobs
    assert a.hosts == ("h1", "h2", "h4", "h5") and a.leaves == ("leaf1", "leaf1", "leaf2", "leaf2")
    assert a.settings.ranks == 4 and a.settings.size == "64K" and a.settings.iterations == 3
    assert b.hosts == ("h3", "h6") and b.settings.collective == "alltoall" and b.settings.ranks == 2
    assert jf.spec.leaves == 2 and jf.spec.hosts_per_leaf == 3 and jf.spec.host_link.rate_mbps == 20
    assert jf.names == ["a", "b"]


def test_placement_takes_only_free_hosts(tmp_path):
    jf = load(tmp_path, FABRIC + """
[[job]]
name = "a"
hosts = ["h1", "h4"]

[[job]]
name = "b"
ranks = 3
placement = "packed"

[[checkpoint]]
name = "c"
hosts = ["h1"]
storage = "h6"
""")
    b = jf.jobs[1]
    # packed over the hosts nobody holds (h1, h4 are a's, h6 is storage): leaf1's h2, h3, then leaf2's h5
    assert b.hosts == ("h2", "h3", "h5") and b.policy == "packed"
    assert jf.checkpoints[0].size_bytes == 1_000_000 and jf.checkpoints[0].count == 3


def test_placement_argument_places_every_job_again_after_the_file_is_checked_as_written(tmp_path):
    p = tmp_path / "jobs.toml"
    p.write_text(FABRIC + """
[[job]]
name = "a"
ranks = 2

[[job]]
name = "b"
ranks = 2

[[dataset]]
name = "d"
storage = "h1"
hosts = ["h6"]
rate_mbps = 1
""")
    packed = jobsfile.load(p, PARAMS, seed=1)
    assert [j.hosts for j in packed.jobs] == [("h2", "h3"), ("h4", "h5")]
    spread = jobsfile.load(p, PARAMS, seed=1, placement="spread")  # file order, storage host h1 left out
    assert [(j.hosts, j.leaves, j.policy) for j in spread.jobs] == [
        (("h2", "h4"), ("leaf1", "leaf2"), "spread"), (("h3", "h5"), ("leaf1", "leaf2"), "spread")]
    assert spread.datasets == packed.datasets
    p.write_text(FABRIC + '[[job]]\nname = "a"\nranks = 5\n[[job]]\nname = "b"\nranks = 2\n')
    with pytest.raises(UsageError) as e:  # refused as written, before the policy is tried
        jobsfile.load(p, PARAMS, seed=1, placement="spread")
    assert "[[job]] b: placement packed: 2 ranks but only 1 hosts" in str(e.value)
    p.write_text(TWO_JOBS)
    with pytest.raises(UsageError) as e:
        jobsfile.load(p, PARAMS, placement="topo")
    assert str(e.value).startswith("placement=topo: job a lists its hosts in jobs.toml;")


def test_solo_keeps_fabric_and_hosts(tmp_path):
    jf = load(tmp_path, TWO_JOBS)
    s = jobsfile.solo(jf, "b")
    assert [j.name for j in s.jobs] == ["b"] and s.jobs[0].hosts == ("h3", "h6") and s.spec is jf.spec
    assert not s.checkpoints and not s.datasets


def test_dataset_entry(tmp_path):
    jf = load(tmp_path, FABRIC + """
[[job]]
name = "a"
hosts = ["h1", "h2", "h4"]

[[dataset]]
name = "d"
storage = "h6"
hosts = ["h1", "h2"]
rate_mbps = 2.5
dscp = 8
""")
    d = jf.datasets[0]
    assert (d.storage, d.hosts, d.rate_mbps, d.dscp, d.duration_s) == ("h6", ("h1", "h2"), 2.5, 8, 0.0)


@pytest.mark.parametrize("text, words", [
    ("[fabric]\nspines = 1\n[[job]]\nname = \"a\"\nhosts = [\"h1\", \"h2\"]\n", "one entry only"),
    (FABRIC + "[[checkpoint]]\nname = \"c\"\nhosts = [\"h1\"]\nstorage = \"h2\"\n"
     "[[checkpoint]]\nname = \"d\"\nhosts = [\"h1\"]\nstorage = \"h2\"\n", "no [[job]]"),
    (TWO_JOBS.replace('"h3", "h6"', '"h3", "h1"'), "h1 already runs job a"),
    (TWO_JOBS.replace('"h3", "h6"', '"h3", "h9"'), "unknown host 'h9'"),
    (TWO_JOBS.replace('name = "b"', 'name = "a"'), "used twice"),
    (TWO_JOBS.replace('name = "b"', 'name = "../b"'), "name: a letter"),
    (TWO_JOBS.replace('iterations = 3', 'iterations = 0'), "iterations: must be >= 1"),
    (TWO_JOBS.replace('iterations = 3', 'iterations = "3"'), "iterations: not a valid int"),
    (TWO_JOBS.replace('iterations = 3', 'iteration = 3'), "unknown key 'iteration'"),
    (TWO_JOBS.replace('iterations = 3', 'background = "h1>h3"'), "background is not taken"),
    (TWO_JOBS.replace('iterations = 3', 'placement = "spread"'), "hosts or placement, not both"),
    (TWO_JOBS.replace('iterations = 3', 'ranks = 3'), "ranks = 3 but 4 hosts"),
    (TWO_JOBS.replace('collective = "alltoall"', 'collective = "allsorts"'), "[[job]] b"),
    (TWO_JOBS.replace('spines = 1', 'spine = 1'), "[fabric]: unknown key 'spine'"),
    (TWO_JOBS.replace('spines = 1', 'spines = 0'), "[fabric]: spines: must be >= 1"),
    (TWO_JOBS.replace('[fabric]', '[fabrik]'), "top level: unknown key 'fabrik'"),
    (TWO_JOBS + "[[job]]\nname = \"c\"\nranks = 4\n", "placement packed"),
    (TWO_JOBS.replace('"h3", "h6"', '"h3"'), "at least 2 hosts"),
    (TWO_JOBS + "[[checkpoint]]\nname = \"c\"\nhosts = [\"h1\"]\nstorage = \"h6\"\n", "h6 is a storage host"),
    (TWO_JOBS + "[[checkpoint]]\nname = \"c\"\nhosts = [\"h1\"]\nstorage = \"h1\"\nevery_s = 1\n",
     "cannot also be one of them"),
    (TWO_JOBS + "[[checkpoint]]\nname = \"c\"\nhosts = [\"h2\"]\nstorage = \"h1\"\nevery_s = 0\n", "every_s"),
    (TWO_JOBS + "[[checkpoint]]\nname = \"c\"\nhosts = [\"h2\"]\nstorage = \"h1\"\nsize = \"lots\"\n",
     "not a size"),
    (TWO_JOBS + "[[dataset]]\nname = \"d\"\nhosts = [\"h2\"]\nstorage = \"h1\"\n", "rate_mbps is required"),
    ("[fabric\n", "not valid TOML"),
])
def test_refusals(tmp_path, text, words):
    assert words in refused(tmp_path, text)


def test_missing_file_and_topology_file(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        jobsfile.load(tmp_path / "nope.toml", PARAMS)
    msg = refused(tmp_path, TWO_JOBS.replace("[fabric]\n", "[fabric]\ntopology_file = \"missing.toml\"\n")
                  .replace("spines = 1\nleaves = 2\nhosts_per_leaf = 3\nhost_rate_mbps = 20\nfabric_rate_mbps = 20\n",
                           ""))
    assert "topology_file" in msg and str(tmp_path) in msg  # relative to the jobs file's folder


def test_examples_parse():
    for p in sorted((ROOT / "examples" / "jobs").glob("*.toml")):
        jf = jobsfile.load(p, PARAMS)
        assert len(jf.names) >= 2 and jf.jobs


def test_cli_bad_file_is_one_line_exit_2(tmp_path):
    """Before anything is built (and before root is asked for): one line on stderr, exit status 2."""
    p = tmp_path / "bad.toml"
    p.write_text(TWO_JOBS.replace('"h3", "h6"', '"h3", "h1"'))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "jobs", str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "h1 already runs job a" in r.stderr
    assert not (tmp_path / "o").exists()


def test_topology_file_and_dscp(tmp_path):
    """The fabric of a leaf-spine topology file (relative to the jobs file), a job's DSCP into its settings."""
    topo = ROOT / "examples" / "topology-files" / "slow-spine-port.toml"
    (tmp_path / "fabric.toml").write_text(topo.read_text())
    jf = load(tmp_path, """
[fabric]
topology_file = "fabric.toml"

[[job]]
name = "a"
hosts = ["h1", "h3"]
dscp = 26

[[job]]
name = "b"
ranks = 2
placement = "spread"
""")
    assert jf.fabric["topology_file"] == str(tmp_path / "fabric.toml")
    assert jf.jobs[0].settings.dscp == 26 and jf.jobs[1].settings.dscp == 0
    assert set(jf.jobs[1].hosts) == {"h2", "h4"}  # spread over the two leaves' free hosts
    msg = refused(tmp_path, TWO_JOBS.replace("[fabric]\n", "[fabric]\ntopology_file = \"fabric.toml\"\n"))
    assert "topology_file: the file sets" in msg


def test_inference_entry_and_its_refusals(tmp_path):
    jf = load(tmp_path, FABRIC + """
[[job]]
name = "a"
hosts = ["h1", "h2"]

[[inference]]
name = "serve"
server = "h6"
hosts = ["h3", "h1"]
response_size = "256K"
count = 5
""")
    w = jf.inference[0]
    assert (w.server, w.hosts, w.request_bytes, w.response_bytes, w.count) == ("h6", ("h3", "h1"), 4000, 256000, 5)
    assert jobsfile.solo(jf, "a").inference == ()
    bad = (FABRIC + '[[job]]\nname = "a"\nhosts = ["h1", "h2"]\n[[inference]]\nname = "s"\nserver = "h1"\n'
           'hosts = ["h3"]\n')
    assert "h1 is a storage host" in refused(tmp_path, bad)
    assert "cannot also be a client" in refused(tmp_path, bad.replace('hosts = ["h3"]', 'hosts = ["h3", "h1"]')
                                                .replace('hosts = ["h1", "h2"]', 'hosts = ["h4", "h2"]'))
    assert "response_size: size" in refused(tmp_path, bad.replace('server = "h1"', 'server = "h6"\nresponse_size = 0'))


def test_the_docs_jobs_file_is_valid(tmp_path):
    """docs/operations.md's jobs file (the TOML block under "The jobs file") reads and places as written."""
    doc = (ROOT / "docs" / "operations.md").read_text().split("### The jobs file", 1)[1]
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    jf = load(tmp_path, text)
    assert jf.names == ["train", "ckpt", "data", "serve"] and jf.inference[0].server == "h6"
