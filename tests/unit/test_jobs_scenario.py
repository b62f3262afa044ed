"""The `jobs` scenario (scenarios/jobs.py: a jobs file as one run) before anything is built: its settings checked
(a bad one is one line, exit status 2 from the CLI), placement= and solo= applied as documented; and
analysis.jobs.spine_ports, which reads the kernel's port counters into the bytes two jobs' traffic shared. Pure: no
root, no kernel."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from analysis import jobs as aj
from analysis.metricnames import known
from testbed import scenario
from testbed.errors import UsageError
from testbed.params import resolve

ROOT = Path(__file__).resolve().parents[2]
LAB_FILE = "labs/13-noisy-neighbours/jobs.toml"
SC = scenario.get("jobs")
jobs_of = SC.validate.__globals__["jobs_of"]


def params(*sets: str) -> dict:
    return resolve(SC.params, [f"file={LAB_FILE}", *sets])


def refused(p: dict) -> str:
    with pytest.raises(UsageError) as e:
        SC.validate(p)
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_the_lab_file_places_as_the_file_says_and_a_relative_path_is_the_repositorys(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not the repository: the path is still found
    jf = jobs_of(params(), 1)
    assert [j.name for j in jf.jobs] == ["train", "noisy"]
    assert jf.jobs[0].hosts == ("h1", "h2", "h3", "h4")  # the file's own placement: packed, in file order
    assert jf.jobs[1].hosts == ("h5", "h6", "h7", "h8")


def test_placement_places_every_job_again_in_file_order():
    spread = jobs_of(params("placement=spread"), 1)
    assert spread.jobs[0].hosts == ("h1", "h6", "h2", "h7") and spread.jobs[0].policy == "spread"
    assert spread.jobs[1].hosts == ("h3", "h8", "h4", "h9")
    topo = jobs_of(params("placement=topo"), 1)
    assert set(topo.jobs[0].leaves) == {"leaf1"} and set(topo.jobs[1].leaves) == {"leaf2"}
    for seed in (1, 2, 3):  # random: a seeded draw, never a host twice
        a, b = jobs_of(params("placement=random"), seed).jobs
        assert not set(a.hosts) & set(b.hosts)
        assert jobs_of(params("placement=random"), seed).jobs[0].hosts == a.hosts


def test_solo_keeps_the_hosts_the_job_gets_beside_its_neighbours():
    jf = jobs_of(params("placement=spread", "solo=train"), 1)
    assert [j.name for j in jf.jobs] == ["train"] and jf.jobs[0].hosts == ("h1", "h6", "h2", "h7")


@pytest.mark.parametrize("sets, says", [
    (("solo=trian",), "solo: 'trian' is no job of jobs.toml (its jobs: train, noisy)"),
    (("file=labs/13-noisy-neighbours/nope.toml",), "no such file"),
    (("file=labs/13-noisy-neighbours",), "is a folder"),
])
def test_a_bad_setting_is_one_line(sets, says):
    assert says in refused(params(*sets))


def test_an_unknown_placement_is_refused_by_the_parameters_choices():
    with pytest.raises(UsageError) as e:
        params("placement=nearest")
    assert "placement" in str(e.value) and "\n" not in str(e.value)


def test_placement_is_refused_for_a_job_that_lists_its_hosts(tmp_path):
    f = tmp_path / "fixed.toml"
    f.write_text(textwrap.dedent("""
        [fabric]
        spines = 1
        leaves = 2
        hosts_per_leaf = 2
        [[job]]
        name = "a"
        hosts = ["h1", "h3"]
        [[job]]
        name = "b"
        ranks = 2
        """))
    msg = refused(resolve(SC.params, [f"file={f}", "placement=topo"]))
    assert "job a lists its hosts" in msg
    SC.validate(resolve(SC.params, [f"file={f}"]))  # as the file says: fine


def test_a_placement_the_fabric_cannot_hold_is_one_line(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text(textwrap.dedent("""
        [fabric]
        spines = 1
        leaves = 2
        hosts_per_leaf = 2
        [[job]]
        name = "a"
        ranks = 3
        [[job]]
        name = "b"
        ranks = 2
        [[job]]
        name = "c"
        ranks = 2
        """))
    assert "[[job]] b: placement packed: 2 ranks but only 1 hosts" in refused(
        resolve(SC.params, [f"file={f}", "placement=topo"]))


def test_the_cli_refuses_a_bad_setting_with_status_2_before_anything_is_built():
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "jobs", "--set", f"file={LAB_FILE}",
                          "--set", "solo=nobody"], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and "solo" in out.stderr


PORTS = [  # port_deltas.csv rows of 1 spine x 2 leaves
    {"node": "h1", "port": "eth0", "sent_bytes": 900, "drops": 5},
    {"node": "leaf1", "port": "h1", "sent_bytes": 800, "drops": 1},
    {"node": "leaf1", "port": "spine1", "sent_bytes": 1000, "drops": 2},
    {"node": "spine1", "port": "leaf1", "sent_bytes": 2000, "drops": 0},
    {"node": "leaf2", "port": "spine1", "sent_bytes": 3000, "drops": 4},
    {"node": "spine1", "port": "leaf2", "sent_bytes": 4000, "drops": 0},
]


def test_spine_ports_shared_only_where_two_entries_cross_at_the_same_leaf():
    both = aj.spine_ports(PORTS, {"train": ["leaf1", "leaf2"], "noisy": ["leaf1", "leaf2"]})
    assert both == {"spine_port_bytes": 10_000, "shared_ports": 4, "shared_port_bytes": 10_000,
                    "shared_port_drops": 6, "switch_drops": 7}
    apart = aj.spine_ports(PORTS, {"train": ["leaf1"] * 4, "noisy": ["leaf2"] * 4})
    assert apart["shared_ports"] == 0 and apart["shared_port_bytes"] == 0 and apart["spine_port_bytes"] == 10_000
    one = aj.spine_ports(PORTS, {"train": ["leaf1"] * 4, "noisy": ["leaf1", "leaf2"], "ckpt": ["leaf2", "leaf1"]})
    assert one["shared_ports"] == 4  # a storage stream across the spine is a neighbour too


def test_the_summary_names_are_known_to_lab_statements():
    for name in ("job_train_step_ms_p99", "job_noisy_step_ms_p50", "job_train_cct_ms_p99", "job_train_overlap",
                 "job_my-job_leaves", "spine_port_bytes", "shared_ports", "shared_port_bytes", "shared_port_drops",
                 "jobs_n"):
        assert known(name), name
    assert not known("job_train_step_p99")
