"""Mininet nodes that live in the testbed's named network namespaces.

A Mininet node is a shell in a network namespace. Stock Mininet makes an *unnamed* namespace per node (``mnexec
-n``) that only the shell's pid holds. The testbed's nodes are ``tb-<run>-<node>`` namespaces, bind-mounted under
/run/netns, created with the whole fabric through netlink (testbed.network.fabric): so ``ip netns``, nsenter, pyroute2
and
``testbed clean`` reach them by name, and a killed run leaves nothing they cannot find. These classes give those
namespaces Mininet's node API (``cmd``, ``popen``, ``sendCmd``, ``IP``, ``intfList``, the CLI):

* the shell is Mininet's own (``mnexec -cd bash`` with the prompt sentinel) started under ``nsenter --net=``
  inside the named namespace, and only on the first command: building a fabric spawns no process per node (a
  process spawn costs ~100 ms under the lab VM's software CPU);
* ``popen``/``pexec`` run a program in the namespace through ``nsenter`` (no shell needed);
* an end host's shell and processes run under the host's own name (testbed.kernel.uts: a UTS namespace per process
  tree, so ``h1 hostname`` in the CLI says h1, as a cluster's servers each have their own hostname);
* leaves, spines and dumbbell switches are :class:`TestbedRouter`: to Mininet they are switches (``net.switches``,
  not pinged by ``pingAll``), to the kernel L3 routers (forwarding, static and ECMP routes, set up by the fabric).
"""

from __future__ import annotations

from typing import Any

from mininet.node import Host, Node

from testbed.kernel import uts


class NamedNamespaceNode(Node):
    """A Mininet node whose shell and processes run in an existing named namespace (``namespace``)."""

    def __init__(self, name: str, namespace: str = "", role: str = "host", addresses: dict | None = None,
                 server: str = "localhost", **params: Any):
        if not namespace:
            raise ValueError(f"{name}: a testbed node needs its named namespace")
        self.namespace = namespace
        self.role = role
        self.server = server  # as on Mininet's cluster edition's RemoteNode: the server it is placed on
        self.addresses = dict(addresses or {})  # ifname -> topologies.Interface (the address plan)
        params.pop("listenPort", None)
        params["inNamespace"] = False
        super().__init__(name, **params)

    # ---- the shell: Mininet's, in the named namespace, started on first use ----

    def startShell(self, mnopts=None) -> None:  # noqa: N802 - Mininet's name
        """Deferred: :meth:`_ensure_shell` starts it when a command first needs it."""

    def _ensure_shell(self) -> None:
        if self.shell is None:
            Node.startShell(self)

    def _popen(self, cmd, **params):
        return super()._popen(["nsenter", f"--net=/run/netns/{self.namespace}", *self._named(list(cmd))], **params)

    def _named(self, cmd: list) -> list:
        """The command as this node runs it: as is (routers)."""
        return cmd

    def cmd(self, *args, **kwargs):
        self._ensure_shell()
        return super().cmd(*args, **kwargs)

    def sendCmd(self, *args, **kwargs):  # noqa: N802
        self._ensure_shell()
        return super().sendCmd(*args, **kwargs)

    def write(self, data):
        self._ensure_shell()
        return super().write(data)

    def waitReadable(self, timeoutms=None):  # noqa: N802
        self._ensure_shell()
        return super().waitReadable(timeoutms)

    def popen(self, *args, **kwargs):
        """A process in this node's namespace (``nsenter --net``), as Mininet's ``popen``; needs no shell."""
        kwargs.setdefault("mncmd", [])
        return super().popen(*args, **kwargs)

    def terminate(self) -> None:
        if self.shell is not None:
            super().terminate()

    # ---- interfaces: the address plan, not ifconfig ----

    def addIntf(self, intf, port=None, moveIntfFn=None):  # noqa: N802
        """Register an interface the fabric already created in this namespace (nothing to move)."""
        return super().addIntf(intf, port=port, moveIntfFn=lambda *a, **k: None)

    def config(self, **params):
        """Addresses, routes and queues come from the fabric (netlink); Mininet's ifconfig/route calls are not
        made."""
        return {}

    def configDefault(self, **moreParams):  # noqa: N802
        self.params.update(moreParams)
        return {}


class TestbedHost(NamedNamespaceNode, Host):
    """An end host (a rank's server) in its named namespace."""

    __test__ = False  # not a pytest class

    def _named(self, cmd: list) -> list:
        """Under the host's own hostname (a UTS namespace of its own)."""
        return uts.named(self.name, cmd)


class TestbedRouter(NamedNamespaceNode):
    """A leaf, spine or dumbbell switch: a Mininet *switch* that the kernel runs as an L3 router."""

    __test__ = False  # not a pytest class

    def start(self, controllers) -> None:
        """Nothing to start: forwarding, routes and queues were set up with the fabric."""

    def stop(self, deleteIntfs: bool = False) -> None:  # noqa: N803
        """Interfaces go with the namespace when the fabric is torn down."""
        self.terminate()

    def connected(self) -> bool:
        return True

    def defaultIntf(self):  # noqa: N802
        intfs = self.intfList()
        return intfs[0] if intfs else None
