"""Independent checks of doctor's verdicts: try each capability with the stock command-line tools (tc, ip, sysctl,
rdma) instead of the project's netlink code, so a wrong doctor cannot confirm itself."""

from __future__ import annotations

import shutil
import subprocess
import uuid


def sh(cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout)


class ScratchNs:
    def __enter__(self):
        self.ns = f"tb-chk-{uuid.uuid4().hex[:6]}"
        assert sh(f"ip netns add {self.ns}").returncode == 0
        assert sh(f"ip -n {self.ns} link add tbca type veth peer name tbcb").returncode == 0
        sh(f"ip -n {self.ns} link set tbca up; ip -n {self.ns} link set tbcb up")
        return self

    def run(self, cmd: str) -> bool:
        return sh(f"ip netns exec {self.ns} sh -c '{cmd}'").returncode == 0

    def __exit__(self, *exc):
        sh(f"ip netns del {self.ns}")


# A namespace's *default* congestion control may only be set to one the init namespace allows
# (net.ipv4.tcp_allowed_congestion_control), so the capability is checked as senders use it: on a socket.
CC_ON_SOCKET = ("/usr/bin/python3 -c \"import socket; s = socket.socket(); "
                "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b\\\"{cc}\\\")\"")

QDISC_CMDS = {
    "qdisc:htb": "tc qdisc add dev tbca root handle 1: htb",
    "qdisc:tbf": "tc qdisc add dev tbca root tbf rate 10mbit burst 15k latency 50ms",
    "qdisc:bfifo": "tc qdisc add dev tbca root bfifo limit 100000",
    "qdisc:pfifo": "tc qdisc add dev tbca root pfifo limit 100",
    "qdisc:red+ecn": "tc qdisc add dev tbca root red limit 200000 min 30000 max 90000 avpkt 1500 burst 30 "
                     "probability 0.1 ecn",
    "qdisc:netem": "tc qdisc add dev tbca root netem delay 1ms",
    "qdisc:prio": "tc qdisc add dev tbca root prio bands 3",
    "qdisc:ets": "tc qdisc add dev tbca root ets bands 2 strict 2",
    "qdisc:plug": "tc qdisc add dev tbca root plug limit 10000",
    "qdisc:clsact": "tc qdisc add dev tbca clsact",
    "cls:u32": "tc qdisc add dev tbca root handle 1: htb && tc filter add dev tbca parent 1: protocol ip u32 "
               "match u32 0 0 flowid 1:10",
    "cls:flower": "tc qdisc add dev tbca root handle 1: htb && tc filter add dev tbca parent 1: protocol ip "
                  "flower classid 1:10",
    "cls:basic+meta": "tc qdisc add dev tbca root handle 1: htb && tc filter add dev tbca parent 1: protocol ip "
                      "basic match \"meta(random mask 1 eq 0)\" classid 1:10",
    "act:skbedit": "tc qdisc add dev tbca root handle 1: htb && tc filter add dev tbca parent 1: protocol ip "
                   "u32 match u32 0 0 flowid 1:10 action skbedit priority 1:1",
    "act:mirred": "tc qdisc add dev tbca root handle 1: htb && tc filter add dev tbca parent 1: protocol ip "
                  "u32 match u32 0 0 flowid 1:10 action mirred egress redirect dev tbcb",
    "tcp:cubic": CC_ON_SOCKET.format(cc="cubic"),
    "tcp:reno": CC_ON_SOCKET.format(cc="reno"),
    "tcp:dctcp": CC_ON_SOCKET.format(cc="dctcp"),
    "tcp:bbr": CC_ON_SOCKET.format(cc="bbr"),
    "sysctl:ecn": "sysctl -qw net.ipv4.tcp_ecn=1",
    "sysctl:multipath-hash": "sysctl -qw net.ipv4.fib_multipath_hash_policy=1",
    "rxe:netns": "rdma link add tbchkrxe type rxe netdev tbca && rdma link delete tbchkrxe",
}


def independent_verdicts(names) -> dict[str, bool]:
    """The verdicts of every name with an independent check, the qdisc/classifier/TCP/sysctl/rxe ones run as ONE
    shell script in one scratch namespace (its veth's qdiscs removed between checks): a process per command is
    what the emulated lab VM pays most for (one namespace and ~6 processes per check took 117 s there)."""
    out: dict[str, bool] = {}
    batch = [n for n in names if n in QDISC_CMDS]
    if batch:
        reset = "tc qdisc del dev tbca root 2>/dev/null; tc qdisc del dev tbca clsact 2>/dev/null; "
        script = "".join(f"{reset}( {QDISC_CMDS[n]} ) >/dev/null 2>&1; echo \"{n} $?\"; " for n in batch)
        with ScratchNs() as s:
            r = sh(f"ip netns exec {s.ns} sh -c '{script}'", timeout=300)
        for line in r.stdout.splitlines():
            name, _, code = line.rpartition(" ")
            if name in QDISC_CMDS:
                out[name] = code == "0"
        missing = [n for n in batch if n not in out]
        assert not missing, f"no verdict for {missing}: {r.stderr[-500:]}"
    for n in names:
        if n not in out:
            v = independent_verdict(n)
            if v is not None:
                out[n] = v
    return out


def independent_verdict(name: str) -> bool | None:
    """True/False from the stock tools, or None when there is no independent check for `name`."""
    if name in QDISC_CMDS:
        with ScratchNs() as s:
            return s.run(QDISC_CMDS[name])
    if name == "mininet":
        return shutil.which("mnexec") is not None and sh("/usr/bin/python3 -c 'import mininet.net'").returncode == 0
    if name == "pyverbs":
        return sh("/usr/bin/python3 -c 'import pyverbs'").returncode == 0
    if name == "ovs":
        return shutil.which("ovs-vsctl") is not None and (
            sh("grep -qw openvswitch /proc/modules || modprobe openvswitch").returncode == 0)
    return None
