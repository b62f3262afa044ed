"""The servers file: which machines a fabric is split over, and how each is reached (docs/servers.md).

One server per line, ``NAME TARGET [key=PATH] [address=IPv4] [mtu=BYTES]``; ``#`` starts a comment. ``TARGET`` is
``localhost`` (the in-kernel server of today: this machine) or an ssh target ``[user@]host[:port]``, as Mininet's
cluster edition names its servers (user@server over passwordless ssh) and MaxiNet's configuration file lists its
workers with their addresses. The first server is the reference: it runs the lab and the controller, and its clock is
the run's. ``address`` is the server's own address on the network joining the servers (what the VXLAN tunnels and
the clock echo use; default: the target's host when that is an IPv4 literal, otherwise the host name resolved to its
first IPv4 address by this machine, the reference, when the file is loaded); ``mtu`` that network's MTU, which caps
every port crossing to the server at ``mtu - 50`` (VXLAN's overhead).

:func:`parse` is pure: nothing is resolved, contacted or created; every mistake is one line (UsageError) naming the
line. :func:`load` reads a file, parses it and resolves the host names that stand for an address.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import UsageError
from testbed.kernel.tunnel import VXLAN_OVERHEAD_BYTES
from testbed.network.cluster import MAX_SERVERS

LOCAL = "localhost"
DEFAULT_MTU = 1500
#: the smallest underlay MTU that still carries a 1280-byte fabric frame (IPv6's minimum) through VXLAN
MIN_MTU = 1280 + VXLAN_OVERHEAD_BYTES
MAX_MTU = 65535
OPTIONS = ("key", "address", "mtu")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_TARGET = re.compile(r"(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252})"
                     r"(?::(?P<port>[0-9]{1,5}))?")


@dataclass(frozen=True)
class Server:
    """One machine of the run: how ssh reaches it and its address and MTU on the network between the servers."""

    name: str
    target: str                 # as written: "localhost" or "[user@]host[:port]"
    host: str
    user: str | None = None
    port: int = 22
    key: str | None = None      # the ssh identity file
    address: str | None = None  # IPv4 on the servers' network; None: not given (load() resolves `host`)
    mtu: int = DEFAULT_MTU

    @property
    def local(self) -> bool:
        return self.target == LOCAL

    def ssh_destination(self) -> list[str]:
        """ssh arguments naming this server (``-p PORT -i KEY [user@]host``); UsageError for the local one."""
        if self.local:
            raise UsageError(f"server {self.name} is this machine: it is not reached over ssh")
        args = ["-p", str(self.port)] + (["-i", self.key] if self.key else [])
        return args + [f"{self.user}@{self.host}" if self.user else self.host]


def _ipv4(text: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        return None


def _server(fields: list[str], where: str) -> Server:
    if len(fields) < 2:
        raise UsageError(f"{where}: expected NAME TARGET [key=PATH] [address=IPv4] [mtu=BYTES]")
    name, target, *rest = fields
    if not _NAME.fullmatch(name):
        raise UsageError(f"{where}: server name {name!r}: letters, digits, '-' and '_', at most 32")
    opts: dict[str, str] = {}
    for item in rest:
        key, eq, value = item.partition("=")
        if not eq or key not in OPTIONS or not value:
            raise UsageError(f"{where}: {item!r}: options are {', '.join(o + '=...' for o in OPTIONS)}")
        if key in opts:
            raise UsageError(f"{where}: {key}= given twice")
        opts[key] = value
    if target == LOCAL:
        host, user, port = LOCAL, None, 22
    else:
        m = _TARGET.fullmatch(target)
        if not m or not 1 <= int(m["port"] or 22) <= 65535:
            raise UsageError(f"{where}: ssh target {target!r}: expected localhost or [user@]host[:port]")
        host, user, port = m["host"], m["user"], int(m["port"] or 22)
    address = opts.get("address")
    if address is not None and (address := _ipv4(address)) is None:
        raise UsageError(f"{where}: address={opts['address']!r} is not an IPv4 address")
    mtu_text = opts.get("mtu", str(DEFAULT_MTU))
    if not mtu_text.isdigit() or not MIN_MTU <= int(mtu_text) <= MAX_MTU:
        raise UsageError(f"{where}: mtu={mtu_text!r}: an integer {MIN_MTU}..{MAX_MTU}")
    return Server(name, target, host, user, port, opts.get("key"), address or _ipv4(host), int(mtu_text))


def _check_unique(servers: list[Server], source: str) -> None:
    for what, key in (("name", lambda s: s.name), ("ssh target", lambda s: (s.host, s.port)),
                      ("address", lambda s: s.address)):
        seen: dict = {}
        for s in servers:
            k = key(s)
            if k is None:
                continue
            if k in seen:
                raise UsageError(f"{source}: servers {seen[k]} and {s.name} have the same {what}")
            seen[k] = s.name


def resolve_addresses(servers: list[Server], source: str = "servers file",
                      lookup=socket.getaddrinfo) -> list[Server]:
    """The servers with ``address`` filled in for each ssh server that names a host instead of giving address=:
    the host's first IPv4 address as this machine (the reference, which also opens the ssh connection) resolves
    it. UsageError, one line, for a name that does not resolve, or two servers that end up at one address."""
    out = []
    for s in servers:
        if s.address is None and not s.local:
            try:
                found = [a[4][0] for a in lookup(s.host, None, socket.AF_INET)]
            except (socket.gaierror, UnicodeError) as e:
                raise UsageError(f"{source}: server {s.name}: {s.host} does not resolve to an IPv4 address "
                                 f"({getattr(e, 'strerror', None) or e}); give address=") from None
            if not found:
                raise UsageError(f"{source}: server {s.name}: {s.host} has no IPv4 address; give address=")
            if ipaddress.IPv4Address(found[0]).is_loopback:  # e.g. Debian's 127.0.1.1 for the machine's own name
                raise UsageError(f"{source}: server {s.name}: {s.host} resolves to {found[0]}, a loopback address, "
                                 "not one on the servers' network; give address=")
            s = dataclasses.replace(s, address=found[0])
        out.append(s)
    _check_unique(out, source)
    return out


def parse(text: str, source: str = "servers file") -> list[Server]:
    """The servers of ``text`` in order (the first is the reference). UsageError, one line, on any mistake."""
    servers: list[Server] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if fields:
            servers.append(_server(fields, f"{source}:{lineno}"))
    if not servers:
        raise UsageError(f"{source}: no servers (one per line: NAME TARGET [options])")
    if len(servers) > MAX_SERVERS:
        raise UsageError(f"{source}: {len(servers)} servers, at most {MAX_SERVERS}")
    _check_unique(servers, source)
    return servers


def load(path: str | Path) -> list[Server]:
    """The servers file at ``path``, its host names resolved (:func:`resolve_addresses`); UsageError when it cannot
    be read or a name does not resolve."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"servers file {path}: {e.strerror if isinstance(e, OSError) else 'not text'}") from None
    return resolve_addresses(parse(text, str(path)), str(path))


def crossing_mtu(servers: list[Server]) -> int:
    """The largest fabric MTU a link crossing between these servers can carry: the smallest underlay MTU less
    VXLAN's 50 bytes (a larger port would have its frames fragmented or dropped on the servers' network)."""
    return min(s.mtu for s in servers) - VXLAN_OVERHEAD_BYTES
