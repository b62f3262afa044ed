"""A fabric over servers built by the servers' agents (testbed.network.serverfabric, docs/servers.md), on one
kernel: two agents, each started inside a namespace standing for a server's own network stack (its NIC on a wire
between them), build their shares of a 2x2 leaf-spine with the crossing links as VXLAN between the NICs' addresses.
A 2-rank ring all-reduce runs over it with its control channel TCP between the servers' namespaces
(testbed.workloads.serverjobs). The two-kernel version (one share in the lab VM) is tests/host/test_two_kernels_host.py.
About 14 s (the lease test 6 s, the collective 3.6 s)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import time

import pytest

from tests.serverdrive import assert_delivered, transfer
from testbed.network.serverfabric import ServerFabric
from testbed.workloads.serverjobs import clock_models
from testbed.measure.serversamples import sample_servers
from testbed.network.serverlink import AgentError, AgentLink, agent_command
from testbed.errors import UsageError
from testbed.kernel import links, netns, tunnel
from testbed.network import share
from testbed.network.serversfile import parse
from topologies.leafspine import uniform_leaf_spine

SIZE_BYTES = 2_000_000


@contextlib.contextmanager
def two_servers(lease_s: float | None = None):
    """Two 'server' namespaces joined by a veth (198.19.0.1 and .2), an agent started inside each (leased for
    ``lease_s``, not renewed: a lab that goes silent)."""
    rid = secrets.token_hex(2)
    nics = [f"tb-{rid}-nic1", f"tb-{rid}-nic2"]
    agents = []
    try:
        for n in nics:
            netns.create(n)
        links.add_veth(nics[0], "nic", nics[1], "nic")
        for ns, addr in zip(nics, ("198.19.0.1", "198.19.0.2")):
            links.add_address(ns, "nic", addr, 24)
            with netns.ipr_in(ns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="nic")[0], state="up")
        servers = parse("server-1 localhost address=198.19.0.1\nserver-2 root@198.19.0.2\n")
        agents = [AgentLink(s, netns.in_namespace(ns, agent_command(lease_s=lease_s)))
                  for s, ns in zip(servers, nics)]
        yield nics, agents
        assert scratch_links(nics) == [], scratch_links(nics)   # no VXLAN end left in a server's own namespace
    finally:
        for a in agents:
            a.close()
        for n in nics:
            netns.remove(n)


def scratch_links(nics: list[str]) -> list[str]:
    """Links in the servers' own namespaces besides their NIC and loopback (a VXLAN end caught between its creation
    and its move, tbvx<VNI>, would be one)."""
    out = []
    for ns in nics:
        with netns.ipr_in(ns) as ipr:
            out += [f"{ns}:{lk.get_attr('IFLA_IFNAME')}" for lk in ipr.get_links()
                    if lk.get_attr("IFLA_IFNAME") not in ("lo", "nic")]
    return out


def test_each_server_builds_its_share_and_tcp_crosses_the_tunnel(tmp_path):
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    run = secrets.token_hex(3)
    with two_servers() as (nics, agents):
        with ServerFabric(topo, run, agents) as fab:
            d = fab.describe()
            assert d["placement"] == {"server-1": ["h1", "leaf1", "spine1"], "server-2": ["h2", "leaf2", "spine2"]}
            assert set(netns.list_ours()) >= {fab.ns(n) for n in ("h1", "h2", "leaf1", "leaf2", "spine1", "spine2")}
            start = fab.clock(exchanges=20)
            sampling = sample_servers(fab, every_ms=2.0)     # each server samples its own ports
            before = fab.counters()
            t_sent = time.monotonic()
            out = transfer(fab, "h1", "h2", SIZE_BYTES)
            t_done = time.monotonic()
            seconds = assert_delivered(out, SIZE_BYTES)
            after = fab.counters()
            # the data went through the tunnels: VXLAN datagrams arrived at server-2's NIC, at least one per
            # full-size segment, and its crossing ports received them
            got = after["server-2"]["udp"]["InDatagrams"] - before["server-2"]["udp"]["InDatagrams"]
            assert got >= SIZE_BYTES // 1450, (got, after)
            rx = sum(p["rx_bytes"] for p in after["server-2"]["ports"].values())
            assert rx >= SIZE_BYTES, after
            assert seconds >= SIZE_BYTES * 8 / 20e6 * 0.9       # shaped: no faster than the 20 Mbit/s ports
            end = fab.clock(exchanges=20)                        # a second pass binds the echo's port again
            _samples_of_both_servers(sampling.stop(clock_models(start, end)), t_sent, t_done)
            rec = fab.record(tmp_path / "servers.json")
            s2 = json.loads((tmp_path / "servers.json").read_text())["servers"]["server-2"]
            assert s2 == json.loads(json.dumps(rec["servers"]["server-2"]))
            assert s2["kernel"] == os.uname().release and s2["nodes"] == ["h2", "leaf2", "spine2"]
            for c in s2["clock"]:       # one kernel, one clock: each pass's bound holds zero
                assert c["n"] >= 15 and abs(c["offset_s"]) <= c["uncertainty_s"] < 1e-3, c
            assert len(s2["clock"]) == 2
            assert s2["tunnels"]["udp"]["InDatagrams"] >= got
            # each server's NIC as its agent found it before the build: a veth's GRO is off (no NAPI), no caveat
            assert s2["nic"]["ifname"] == "nic" and s2["nic"]["mtu"] == 1500 and s2["nic"]["gro_on"] is False
            assert s2["nic"]["gro"]["rx-gro"] is False and rec["caveats"] == []
        left = [n for n in netns.list_ours() if n.startswith(f"tb-{run}-")]
        assert left == [], left


def _samples_of_both_servers(got, t_sent: float, t_done: float) -> None:
    """Each server sampled its own share's ports (every row's node is one placed there), on the reference clock:
    the transfer's bytes left h1's port (server-1) and reached h2 through leaf2's (server-2), each growing only while
    the transfer ran (within the far clock's bound and one sampling round)."""
    placed = {"server-1": {"h1", "leaf1", "spine1"}, "server-2": {"h2", "leaf2", "spine2"}}
    assert set(got.stats) == set(placed) and all(st["queue_samples"] > 10 for st in got.stats.values()), got.stats
    slack = got.stats["server-2"]["clock_uncertainty_s"] + 0.05
    assert 0 < slack - 0.05 < 1e-3, got.stats
    for server, nodes in placed.items():
        assert got.cpu[server], server
    grew: dict[tuple, list] = {}
    for t, node, port, _cls, *nums in got.queues:
        grew.setdefault((node, port), []).append((t, nums[4]))     # sent_bytes
    assert {n for n, _ in grew} == placed["server-1"] | placed["server-2"], sorted(grew)
    for node in ("h1", "leaf2"):   # h1's only port; leaf2's port towards h2 carried the most
        rows = max((v for (n, _), v in grew.items() if n == node), key=lambda v: v[-1][1] - v[0][1])
        assert rows[-1][1] - rows[0][1] >= SIZE_BYTES, (node, rows[0], rows[-1])
        moving = [t for (t, b), (_, b0) in zip(rows[1:], rows) if b > b0]
        assert t_sent - slack <= moving[0] and moving[-1] <= t_done + slack, (node, moving[0], moving[-1],
                                                                                 t_sent, t_done)


def test_a_share_is_removed_when_its_agent_loses_the_lab():
    """The lab process dies (SIGKILL included): each agent's stdin closes and it removes its share."""
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    run = secrets.token_hex(3)
    with two_servers() as (nics, agents):
        ServerFabric(topo, run, agents).build()
        assert len([n for n in netns.list_ours() if n.startswith(f"tb-{run}-")]) == 6
        for a in agents:
            a.proc.stdin.close()
            assert a.proc.wait(timeout=30) == 0
        assert [n for n in netns.list_ours() if n.startswith(f"tb-{run}-")] == []


def test_a_share_is_removed_when_its_lab_goes_silent():
    """The link goes quiet without closing (the lab frozen, a cable pulled: no EOF, no SIGHUP until sshd's keepalive
    hours later): once no request came for the lease, each agent removes its share and ends with status 1."""
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    run = secrets.token_hex(3)
    with two_servers(lease_s=5.0) as (nics, agents):   # 5 s: one share may be built seconds before the other
        ServerFabric(topo, run, agents).build()
        assert len([n for n in netns.list_ours() if n.startswith(f"tb-{run}-")]) == 6
        for a in agents:                       # the pipes stay open: only the requests stop
            assert a.proc.wait(timeout=30) == 1
        assert [n for n in netns.list_ours() if n.startswith(f"tb-{run}-")] == []


def test_a_fabric_that_does_not_fit_the_nics_is_refused_before_any_agent_builds():
    topo = uniform_leaf_spine(2, 2, 1, 20, 20)      # MTU 1500 over 1500-byte NICs (the servers file's mtu=)
    with two_servers() as (nics, agents):
        before = set(netns.list_ours())
        with pytest.raises(Exception, match="VXLAN leaves 1450"):
            ServerFabric(topo, secrets.token_hex(3), agents)
        assert set(netns.list_ours()) == before
        fits = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
        # the servers file gives server-2 an address its NIC does not hold: refused before either server builds
        right = agents[1].server
        agents[1].server = dataclasses.replace(right, address="198.19.0.9")
        run = secrets.token_hex(3)
        with pytest.raises(UsageError, match=r"^server server-2: address 198\.19\.0\.9 .* is on none of its "
                           r"interfaces .*found: .*198\.19\.0\.2/24 on nic"):
            ServerFabric(fits, run, agents).build()
        agents[1].server = right
        # server-2's real NIC has MTU 1400 where the file says 1500: VXLAN's 1500-byte packets would not fit
        with netns.ipr_in(nics[1]) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="nic")[0], mtu=1400)
        with pytest.raises(UsageError, match=r"^server server-2: 198\.19\.0\.2 is on nic with MTU 1400, but the "
                           r"crossing link \S+ \(MTU 1450 \+ VXLAN's 50\) needs 1500"):
            ServerFabric(fits, run, agents).build()
        assert not [n for n in netns.list_ours() if n.startswith(f"tb-{run}-")]
        assert set(netns.list_ours()) == before
        with netns.ipr_in(nics[1]) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="nic")[0], mtu=1500)
        # GRO on server-2's NIC (as a real NIC or the VM's virtio has it): recorded with the caveat, not refused
        links.set_features(nics[1], "nic", {"rx-gro": True})
        fab = ServerFabric(fits, run, agents)
        fab.check_nics()
        d = fab.describe()
        assert d["servers"]["server-2"]["nic"]["gro_on"] and not d["servers"]["server-1"]["nic"]["gro_on"]
        assert len(d["caveats"]) == 1 and d["caveats"][0].startswith("server server-2: GRO is on on nic (rx-gro)")
        links.set_features(nics[1], "nic", {"rx-gro": False})
        # a share that fails on one server after its namespaces exist (another VXLAN device on server-2 holds the
        # VNI of a crossing link: the kernel refuses a second one on the same UDP port) is removed there, and the
        # other server's, built, is removed too
        run = secrets.token_hex(3)
        with netns.ipr_in(nics[1]) as ipr:
            ipr.link("add", ifname="squatter", kind="vxlan", vxlan_id=share.vni_base(run) + fab.placement.crossing[0]
                     + 1, vxlan_local="198.19.0.2", vxlan_port=tunnel.VXLAN_PORT)
        fab = ServerFabric(fits, run, agents)
        with pytest.raises(AgentError, match="server-2: build_share") as e:
            fab.build()
        assert "server-1" not in str(e.value)
        assert set(netns.list_ours()) == before
        with netns.ipr_in(nics[1]) as ipr:
            ipr.link("del", index=ipr.link_lookup(ifname="squatter")[0])


def test_a_collective_across_servers_verifies_over_tcp_control(tmp_path, monkeypatch):
    """A 2-rank ring all-reduce over the two servers' shares (h1 on server-1, h2 on server-2): the controller listens
    on TCP on server-1's address inside its namespace, each rank is started by its server's agent with its job files
    shipped and the control connection opened from the server's namespace (no AF_UNIX path in common); every rank
    verifies its data, the ranks' ops line up causally on the reference clock, and nothing is left: no rank, no job
    folder. Before the ranks, two strays on the servers' network claim their places (one with a wrong token, one
    with none): both are closed and the real ranks take their places."""
    from tests.serverdrive import allreduce_across, job_processes_left
    from testbed.workloads import serverjobs

    strays: list[socket.socket] = []
    spawn = serverjobs.ServerSpawner.__call__

    def strays_first(self, namespace, argv, **kw):
        if not strays:
            address, _, port = argv[argv.index("--control") + 1][4:].rpartition(":")
            with netns.entered(nics[1]):
                for hello in ({"type": "hello", "rank": 0, "token": "0" * 32}, {"type": "hello", "rank": 1}):
                    strays.append(socket.create_connection((address, int(port)), timeout=5))
                    strays[-1].sendall(json.dumps(dict(hello, addr=["198.19.0.2", 1])).encode() + b"\n")
        return spawn(self, namespace, argv, **kw)
    monkeypatch.setattr(serverjobs.ServerSpawner, "__call__", strays_first)
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    run = secrets.token_hex(3)
    with two_servers() as (nics, agents):
        with ServerFabric(topo, run, agents) as fab:
            res, slack = allreduce_across(fab, tmp_path / "job", ("198.19.0.1", 0), lambda: netns.entered(nics[0]),
                                          3, max_bound_s=1e-3, exchanges=20)
            assert len(strays) == 2 and all(s.recv(100) == b"" for s in strays)   # closed, no peers sent to them
            bound_s = res.clock_uncertainty_s
            assert abs(res.per_rank[1]["clock"]["offset_s"]) <= bound_s           # one kernel, one clock
            print(json.dumps({"slack_s": slack, "bound_s": bound_s, "op_s": [r[6] - r[5] for r in res.ops]}))
            assert not (tmp_path / "job" / "ctl.sock").exists()
            logs = [(tmp_path / "job" / f"agent-{r}.log").read_text() for r in (0, 1)]
            assert all("Traceback" not in x for x in logs), logs
            left = _spawned_processes_end(agents[1], fab.ns("h2"))
    assert job_processes_left() == [], job_processes_left()
    assert not os.path.exists(f"/proc/{left}"), left      # the agent's teardown killed and reaped it


def _spawned_processes_end(agent, ns: str) -> int:
    """A process the agent spawned runs with its files in its folder until killed (then reaped, the folder gone);
    a second one is left running for the agent's teardown. Returns the second's pid."""
    import time

    argv = ["sh", "-c", 'test "$(cat sub/x.txt)" = shipped && echo ok && exec sleep 300']   # ends at once unless
    r = agent.call("spawn", ns=ns, argv=argv, files={"sub/x.txt": "shipped\n"})      # its file was there
    time.sleep(0.5)
    assert agent.call("proc_poll", pid=r["pid"]) == {"rc": None} and os.path.isdir(r["folder"])
    recorded = _run_state_of(r["folder"])        # pid and folder in the agent's run state for `testbed clean`
    assert r["folder"] in recorded["folders"] and r["pid"] in recorded["pids"], recorded
    assert agent.call("proc_kill", pid=r["pid"])["signalled"]
    deadline = time.monotonic() + 10
    while (done := agent.call("proc_poll", pid=r["pid"]))["rc"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done == {"rc": -9, "log": "ok\n"} and not os.path.exists(r["folder"]), done
    assert r["folder"] not in _run_state_of(r["folder"])["folders"]
    with pytest.raises(AgentError, match="must be relative"):
        agent.call("spawn", ns=ns, argv=argv, files={"../x": ""})
    return agent.call("spawn", ns=ns, argv=argv)["pid"]


def _run_state_path(folder: str):
    """Where the agent that made job folder ``folder`` (tb-<run>-job-*) saves its run state."""
    from testbed.commands.clean import JOB_FOLDER
    from testbed.kernel import state

    return state.STATE_DIR / f"{JOB_FOLDER.match(os.path.basename(folder))['run']}.json"


def _run_state_of(folder: str) -> dict:
    return json.loads(_run_state_path(folder).read_text())


def test_a_killed_agents_job_folder_and_process_are_left_to_testbed_clean():
    """An agent SIGKILLed while its rank runs cannot tear down: the rank and its job folder stay, recorded in the
    agent's run state, and `testbed clean`'s plan (what it removes) has both."""
    import shutil
    import signal

    from testbed.commands import clean

    ns = f"tb-{secrets.token_hex(2)}-srv"
    netns.create(ns)
    link = AgentLink.start(parse("server-1 localhost")[0], lease_s=None)
    r = None
    try:
        r = link.call("spawn", ns=ns, argv=["sleep", "300"], files={"job.json": "{}"})
        recorded = _run_state_of(r["folder"])
        assert recorded["pid"] == link.proc.pid and recorded["folders"] == [r["folder"]], recorded
        os.kill(link.proc.pid, signal.SIGKILL)
        link.proc.wait(timeout=10)
        assert os.path.isdir(r["folder"]) and os.path.exists(f"/proc/{r['pid']}")
        planned = clean.plan()
        assert r["folder"] in planned["job_folders"] and r["pid"] in planned["processes"], planned
    finally:
        link.close(grace_s=2)
        if r is not None:                     # what `testbed clean` does for this run (not run whole: it would end
            with contextlib.suppress(ProcessLookupError):        # every run on this machine)
                os.killpg(r["pid"], signal.SIGKILL)
            shutil.rmtree(r["folder"], ignore_errors=True)
            _run_state_path(r["folder"]).unlink(missing_ok=True)
        netns.remove(ns)
