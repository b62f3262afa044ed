"""The servers file (testbed.network.serversfile): servers as Mininet's cluster edition and MaxiNet name them, the
first the reference, and every mistake one line naming its line before anything is contacted. Pure logic."""

from __future__ import annotations

import socket

import pytest

from testbed.errors import UsageError
from testbed.network.serversfile import crossing_mtu, load, parse, resolve_addresses

GOOD = """
# the lab VM as server-2 (docs/servers.md)
server-1  localhost                      # the reference: this machine
server-2  root@198.19.0.2   key=/var/cache/testbed/servers/id_ed25519  mtu=1500
rack3     ops@emu3.example:2222  address=10.0.3.7  mtu=9000
"""


def test_a_servers_file_in_order_with_the_reference_first():
    s = parse(GOOD)
    assert [x.name for x in s] == ["server-1", "server-2", "rack3"]
    assert s[0].local and not s[1].local and s[0].address is None
    assert (s[1].user, s[1].host, s[1].port, s[1].address, s[1].mtu) == ("root", "198.19.0.2", 22, "198.19.0.2", 1500)
    assert (s[2].user, s[2].host, s[2].port, s[2].address, s[2].mtu) == ("ops", "emu3.example", 2222, "10.0.3.7", 9000)
    assert s[1].ssh_destination() == ["-p", "22", "-i", "/var/cache/testbed/servers/id_ed25519", "root@198.19.0.2"]
    assert s[2].ssh_destination() == ["-p", "2222", "ops@emu3.example"]
    assert crossing_mtu(s) == 1450
    with pytest.raises(UsageError, match="this machine"):
        s[0].ssh_destination()


@pytest.mark.parametrize("text, says", [
    ("", "no servers"),
    ("# only a comment\n", "no servers"),
    ("server-1\n", ":1: expected NAME TARGET"),
    ("a localhost\nb root@h:99999\n", ":2: ssh target 'root@h:99999'"),
    ("a localhost\nb root@@h\n", ":2: ssh target"),
    ("-a localhost\n", ":1: server name '-a'"),
    ("a localhost\nb h2 colour=blue\n", ":2: 'colour=blue': options are key=..., address=..., mtu=..."),
    ("a localhost\nb h2 mtu=1500 mtu=9000\n", ":2: mtu= given twice"),
    ("a localhost\nb h2 address=10.0.0.300\n", ":2: address='10.0.0.300' is not an IPv4 address"),
    ("a localhost\nb h2 mtu=1000\n", ":2: mtu='1000': an integer 1330..65535"),
    ("a localhost\na h2\n", "servers a and a have the same name"),
    ("a localhost\nb root@h2\nc ops@h2\n", "servers b and c have the same ssh target"),
    ("a localhost\nb 10.0.0.1\nc h3 address=10.0.0.1\n", "servers b and c have the same address"),
    ("".join(f"s{i} h{i}\n" for i in range(17)), "17 servers, at most 16"),
])
def test_every_mistake_is_one_line_naming_where(text, says):
    with pytest.raises(UsageError) as e:
        parse(text, "srv.txt")
    msg = str(e.value)
    assert says in msg and "\n" not in msg and msg.startswith("srv.txt"), msg


def test_load_reads_a_file_and_names_a_missing_one(tmp_path):
    f = tmp_path / "servers.txt"
    f.write_text(GOOD)
    assert [x.name for x in load(f)] == ["server-1", "server-2", "rack3"]
    with pytest.raises(UsageError, match="servers file .*nope.txt: No such file"):
        load(tmp_path / "nope.txt")


def test_a_host_name_without_address_is_resolved_when_loaded():
    text = "a localhost\nb root@emu1.example:2222 mtu=9000\n"  # an ssh server named by a host name
    a, b = resolve_addresses(parse(text), lookup=_lookup({"emu1.example": "10.0.0.5"}))
    assert a.address is None and b.address == "10.0.0.5" and b.host == "emu1.example"
    assert [s.address for s in parse(text)] == [None, None]  # parse resolves nothing


def test_a_name_that_resolves_to_loopback_is_refused_when_loaded(tmp_path):
    f = tmp_path / "servers.txt"
    f.write_text("a localhost\nb root@localhost:2222\n")  # /etc/hosts, through the real resolver
    with pytest.raises(UsageError) as e:
        load(f)
    assert str(e.value) == (f"{f}: server b: localhost resolves to 127.0.0.1, a loopback address, not one on the "
                            "servers' network; give address=")


def _lookup(table):
    def lookup(host, port, family):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(family, socket.SOCK_STREAM, 6, "", (table[host], 0))]
    return lookup


@pytest.mark.parametrize("text, says", [
    ("a localhost\nb ops@emu9.example\n",
     "srv.txt: server b: emu9.example does not resolve to an IPv4 address (Name or service not known); give address="),
    ("a localhost\nb ops@emu1.example\nc emu2.example\n", "srv.txt: servers b and c have the same address"),
])
def test_a_name_that_does_not_resolve_or_resolves_to_another_servers_address_is_one_line(text, says):
    with pytest.raises(UsageError) as e:
        resolve_addresses(parse(text, "srv.txt"), "srv.txt", lookup=_lookup({"emu1.example": "10.0.0.5",
                                                                              "emu2.example": "10.0.0.5"}))
    assert str(e.value) == says
