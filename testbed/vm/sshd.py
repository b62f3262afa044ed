"""An sshd of one run's own, so the lab VM (or any server) is reached the way Mininet's cluster edition reaches its
servers: OpenSSH, key only, non-interactive (docs/servers.md, issue 29).

Host side (:func:`make_keys`): a per-run client key and a per-run host key made with ssh-keygen in the run's folder,
and a known_hosts line pinning that host key to the server's address, so the client checks the server strictly and
nothing of it outlives the folder. Server side (``python -m testbed.vm.sshd serve``, run as root in the guest, which
sees the host's filesystem): the NIC gets the wire address, the privilege-separation directory is made, and
``/usr/sbin/sshd -D -e`` runs with a config written for this run: it listens only on that address, accepts only the
run's client key, for root, never a password. It runs until the run's folder holds a ``stop`` file (the 9p
share has no inotify: polled), its lifetime ends, or it is sent SIGTERM; then sshd and its sessions are ended.
openssh-server must be installed on the host (scripts/install.sh does it without starting a host sshd).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
#: the guest's own tmpfs (/tmp is fresh in the lab VM): the config lives there, the keys in the run's folder
GUEST_CONF = Path("/tmp/testbed-sshd.conf")


@dataclass(frozen=True)
class Keys:
    """A run's ssh material in ``folder``: the client's identity, the server's host key, the pinned known_hosts."""

    folder: Path

    @property
    def client(self) -> Path:
        return self.folder / "client_ed25519"

    @property
    def host(self) -> Path:
        return self.folder / "host_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.folder / "known_hosts"

    @property
    def stop_file(self) -> Path:
        return self.folder / "stop"


def make_keys(folder: Path, address: str, port: int = 22) -> Keys:
    """A fresh client key and host key in ``folder`` (0700), and known_hosts naming the host key for
    ``address``:``port``. Raises CalledProcessError when ssh-keygen fails."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    keys = Keys(folder)
    for path, comment in ((keys.client, "testbed-client"), (keys.host, "testbed-host")):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    host_pub = keys.host.with_suffix(".pub").read_text().split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    keys.known_hosts.write_text(f"{name} {' '.join(host_pub)}\n")
    return keys


def config(keys: Keys, address: str, port: int = 22, log_level: str = "ERROR") -> str:
    """The run's sshd_config: one address, one host key, one authorized key, root by key only, nothing forwarded.
    StrictModes is off because the keys sit on the 9p share, whose ownership the guest may see differently. PAM stays
    on (passwords and keyboard-interactive off): without it sshd refuses a root whose password field is locked
    ("User root not allowed because account is locked", seen in the lab VM), and the way around that, editing
    /etc/shadow, is not for a test to do."""
    return "\n".join([
        f"ListenAddress {address}:{port}", f"HostKey {keys.host}", f"AuthorizedKeysFile {keys.client}.pub",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM yes", "StrictModes no", "UseDNS no", "PrintMotd no",
        "AllowTcpForwarding no", "X11Forwarding no", "PermitTunnel no", "PidFile none", f"LogLevel {log_level}", "",
    ])


def _nic_up(cidr: str) -> str:
    """The guest's first non-loopback NIC up with ``cidr`` (the far end of the tap); returns its name."""
    subprocess.run(["modprobe", "-q", "virtio_net"], capture_output=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    nics = sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name != "lo")
    if not nics:
        raise SystemExit("sshd: the guest has no NIC (was the VM started with TESTBED_VM_TAP?)")
    subprocess.run(["ip", "addr", "add", cidr, "dev", nics[0]], check=True)
    subprocess.run(["ip", "link", "set", nics[0], "up"], check=True)
    return nics[0]


def serve(keys: Keys, cidr: str, port: int, lifetime_s: float, log_level: str = "ERROR") -> int:
    """Bring the NIC up, run sshd in the foreground until the stop file, the lifetime or SIGTERM; end it."""
    address = cidr.split("/")[0]
    nic = _nic_up(cidr)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    GUEST_CONF.write_text(config(keys, address, port, log_level))
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(GUEST_CONF)], stdin=subprocess.DEVNULL)
    print(f"sshd on {address}:{port} ({nic}), kernel {os.uname().release}", flush=True)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    deadline = time.monotonic() + lifetime_s
    while not stopped and proc.poll() is None and not keys.stop_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    # the listener ends; a session still open (an agent) ends with its connection, or when the VM powers off
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.vm.sshd", description="a run's own sshd (in the guest)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="NIC up, then sshd on its address until FOLDER/stop exists")
    s.add_argument("--folder", required=True, help="the run's folder made by make_keys (shared with the host)")
    s.add_argument("--address", required=True, help="ADDR/PREFIXLEN for the guest's NIC; sshd listens on ADDR")
    s.add_argument("--port", type=int, default=22)
    s.add_argument("--lifetime-s", type=float, default=600.0, help="end after this long whatever happens")
    s.add_argument("--log-level", default="ERROR", help="sshd's LogLevel (its log goes to the command's stderr)")
    args = ap.parse_args(argv)
    if os.environ.get("TESTBED_IN_VM") != "1":   # set by testbed vm's guest script (testbed.vm.labvm.in_vm)
        print("sshd: serve runs inside the lab VM only (it puts an address on the first NIC and starts an sshd): "
              "start it with testbed vm", file=sys.stderr)
        return 2
    if not Path(SSHD).exists():
        print("sshd: /usr/sbin/sshd missing: run scripts/install.sh (openssh-server)", file=sys.stderr)
        return 2
    return serve(Keys(Path(args.folder)), args.address, args.port, args.lifetime_s, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
