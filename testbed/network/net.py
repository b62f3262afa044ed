"""Mininet is the front door: ``TestbedNet`` is a ``mininet.net.Mininet`` whose nodes, links and interfaces are the
testbed's, built through the netlink layer.

    from mininet.cli import CLI
    from testbed.network.net import TestbedNet
    from topologies.mininet_topo import LeafSpineTopo

    net = TestbedNet(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2))
    net.start()
    net.pingAll()
    print(net['leaf1'].cmd('tc -s qdisc show dev h1'))
    CLI(net)            # or testbed.network.net.TestbedCLI(net): same CLI, interface names are not taken for hosts
    net.stop()          # removes every namespace (and so every veth, qdisc and process in it)

What happens underneath, and why it differs from stock Mininet:

* The topology (a :class:`~topologies.mininet_topo.SpecTopo` or any Mininet ``Topo``, read by
  :func:`~topologies.mininet_topo.spec_from_topo`) is a validated spec first: bad input is one line before anything
  is created.
* ``build()`` creates the whole fabric in one netlink pass (testbed.network.fabric: named ``tb-<run>-<node>``
namespaces,
  veths with planned names/MACs/MTU and offloads off, addresses, static/ECMP routes, sysctls, HTB + leaf queues on
  every egress, DSCP classes, spraying, impairments) instead of one ``tc``/``ip``/``ifconfig`` process per setting,
  then gives it Mininet's objects: :mod:`testbed.network.nodes` for the nodes, :class:`TestbedLink`/:class:`TestbedIntf`
  for the links (they wrap the veths the builder made and report the planned addresses).
* ``Mininet.init()``'s ``fixLimits()`` (which raises host-wide sysctls and never restores them) is skipped
  (testbed.kernel.hostguard); ``stop()`` tears down only what this network created; nothing like ``mn -c`` is used.
"""

from __future__ import annotations

from typing import Any, Callable

from mininet.cli import CLI
from mininet.link import Intf, Link
from mininet.log import error, output
from mininet.net import Mininet

from testbed.network.fabric import Fabric
from testbed.kernel.hostguard import skip_mininet_fixlimits
from testbed.network.nodes import TestbedHost, TestbedRouter
from testbed.kernel.state import RunState
from topologies.mininet_topo import spec_from_topo


class TestbedIntf(Intf):
    """One end of a fabric veth, created by the builder: reports the planned address and MAC, runs no ifconfig."""

    __test__ = False  # not a pytest class

    def __init__(self, name, node=None, port=None, link=None, mac=None, **params):
        plan = getattr(node, "addresses", {}).get(name)
        super().__init__(name, node=node, port=port, link=link, mac=plan.mac if plan else mac, **params)
        if plan is not None:
            self.ip, self.prefixLen = plan.ip, plan.prefixlen

    def config(self, **params) -> dict:
        return {}

    def updateIP(self):  # noqa: N802 - Mininet's name
        return self.ip

    def updateMAC(self):  # noqa: N802
        return self.mac

    def updateAddr(self):  # noqa: N802
        return self.ip, self.mac

    def isUp(self, setUp: bool = False) -> bool:  # noqa: N802
        return True

    def delete(self) -> None:
        """The veth goes with its namespace (TestbedNet.stop)."""
        self.node.delIntf(self)


class TestbedLink(Link):
    """A fabric link as Mininet sees it: the veth pair already exists (the builder made it with its shaper and
    queues), so nothing is created or deleted here."""

    __test__ = False  # not a pytest class

    def __init__(self, node1, node2, **params):
        params["intf"] = TestbedIntf
        for k in ("addr1", "addr2"):
            params.pop(k, None)  # the address plan's MACs, not Mininet's random ones
        super().__init__(node1, node2, fast=True, **params)

    @classmethod
    def makeIntfPair(cls, *args, **kwargs):  # noqa: N802
        """Already made by testbed.network.fabric (netlink, in the two named namespaces)."""

    def stop(self) -> None:
        self.intf1.delete()
        self.intf2.delete()


class TestbedNet(Mininet):
    """A Mininet network built by the testbed (see the module docstring). ``state``: the run's
    :class:`~testbed.kernel.state.RunState` (one is made and dropped here when not given); ``rxe``: a SoftRoCE device on
    every host; ``progress``: a callable for progress lines."""

    __test__ = False  # not a pytest class

    def __init__(self, topo, state: RunState | None = None, rxe: bool = False,
                 progress: Callable[[str], None] | None = None, build: bool = True, servers: int = 1,
                 **params: Any):
        skip_mininet_fixlimits()
        self.spec = spec_from_topo(topo)
        self._own_state = state is None
        self.state = state if state is not None else RunState()
        # validates the plan (and its split over `servers`, testbed.network.cluster); creates nothing
        self.fabric = Fabric(self.spec, self.state.run_id, rxe=rxe, servers=servers)
        self._progress = progress
        params.update(host=TestbedHost, switch=TestbedRouter, link=TestbedLink, intf=TestbedIntf, controller=None,
                      autoSetMacs=False, inNamespace=False, ipBase="198.18.0.0/15")
        super().__init__(topo=topo, build=build, **params)

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def ns(self, node: str) -> str:
        """The named namespace of ``node`` (``tb-<run>-<node>``)."""
        return self.fabric.ns(node)

    def buildFromTopo(self, topo=None) -> None:  # noqa: N802 - Mininet's name
        """The fabric in one netlink pass, then Mininet's node and link objects over it."""
        if self._own_state:
            self.state.save()
        try:
            self.fabric.build(self.state, progress=self._progress)
            spec = self.spec
            for n in spec.nodes:
                params = {"namespace": self.fabric.ns(n.name), "role": n.role,
                          "server": self.fabric.placement.server_of[n.name] if self.fabric.server_ns else "localhost",
                          "addresses": {ifn: itf for (node, ifn), itf in spec.addresses.items() if node == n.name}}
                if n.is_host:
                    self.addHost(n.name, **params)
                else:
                    self.addSwitch(n.name, **params)
            for l in spec.links:
                self.addLink(l.a, l.b, intfName1=l.a_port, intfName2=l.b_port)
        except BaseException:
            self._teardown()
            raise

    def iperf(self, hosts=None, l4Type="TCP", udpBw="10M", fmt=None, seconds=5, port=5001):  # noqa: N803
        """Mininet's ``net.iperf`` (iperf 2 between two hosts; returns [server rate, client rate]), fixed for this
        lab: stock Mininet 2.3.0 first runs ``killall -9 iperf`` (every iperf on the machine) and then waits for
        two ``/sec`` lines from the server, one from its telnet probe, which iperf 2.1 (Debian 12) never prints:
        it hangs for ever. Here the server is this call's own process, its readiness is checked in its namespace
        with ``ss``, and it is stopped when the client is done."""
        import time

        client, server = hosts or (self.hosts[0], self.hosts[-1])
        udp = l4Type == "UDP"
        if l4Type not in ("TCP", "UDP"):
            raise ValueError(f"unexpected l4 type: {l4Type}")
        output(f"*** Iperf: testing {l4Type} bandwidth between {client} and {server}\n")
        args = ["iperf", "-p", str(port)] + (["-u"] if udp else []) + (["-f", fmt] if fmt else [])
        srv = server.popen([*args, "-s"], text=True)
        try:
            deadline = time.monotonic() + 10
            listen = "-lun" if udp else "-ltn"
            while f":{port} " not in server.cmd(f"ss -H {listen} sport = :{port}") + " ":
                if time.monotonic() > deadline or srv.poll() is not None:
                    raise RuntimeError(f"iperf server on {server} did not start listening on port {port}")
                time.sleep(0.05)
            cliout = client.cmd(" ".join([*args, "-t", str(seconds), "-c", server.IP()]
                                         + (["-b", udpBw] if udp else [])))
            time.sleep(0.2)
        finally:
            srv.terminate()
            servout = srv.communicate(timeout=10)[0]
        result = [self._parseIperf(servout), self._parseIperf(cliout)]
        if udp:
            result.insert(0, udpBw)
        output(f"*** Results: {result}\n")
        return result

    def configHosts(self) -> None:  # noqa: N802
        """Addresses and routes were set by the fabric."""

    def stop(self) -> None:
        """Mininet's stop (shells, link objects), then the namespaces (and everything in them) go."""
        try:
            super().stop()
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self.fabric.teardown()
        if self._own_state:
            self.state.drop()

    def __enter__(self) -> "TestbedNet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class TestbedCLI(CLI):
    """Mininet's CLI. One difference: a word of the command that names one of the target node's interfaces (the
    testbed names a leaf's host port after the host: ``leaf1 tc -s qdisc show dev h1``) stays a name; stock
    Mininet would replace every node name with that node's IP address."""

    __test__ = False  # not a pytest class

    prompt = "testbed> "

    def default(self, line: str) -> None:
        first, args, line = self.parseline(line)
        if first not in self.mn:
            error(f"*** Unknown command: {line}\n")
            return
        if not args:
            error(f"*** Please enter a command for node: {first} <cmd>\n")
            return
        node = self.mn[first]
        words = args.split(" ")
        rest = [self.mn[w].IP() or w if w in self.mn and w not in node.nameToIntf else w for w in words]
        node.sendCmd(" ".join(rest))
        self.waitForNode(node)
