"""A host's own name: a process started on an emulated host runs in a UTS namespace of its own (``unshare --uts``)
whose hostname is the host's name (h1, h2, ...), as every server of a cluster has its own hostname.

A network namespace gives a host its interfaces, addresses and routes, not its name: without this, every emulated
host answers ``gethostname()`` with the machine's one name. Programs key per-node state by hostname (Open MPI's
session directory ``/tmp/ompi.<hostname>.<uid>``, its node list, shared-memory segment names), and all emulated
hosts share one filesystem, so with one name they collide. The UTS namespace is per process tree, not bound to a
file: it ends with the processes and leaves nothing to clean up.
"""

from __future__ import annotations

import re

#: the shell words that start ``sh -c CMD`` in a new UTS namespace named by the word after them:
#: ``nsenter ... {SHELL_NAMED} h2 "CMD"`` (sethostname needs CAP_SYS_ADMIN in the new namespace: root)
SHELL_NAMED = "unshare --uts sh -c 'hostname \"$0\" && exec sh -c \"$1\"'"


def hostname_for(node: str) -> str:
    """The hostname a node runs under: its name, with any character a hostname cannot hold (``hostname`` accepts
    letters, digits, hyphens and dots) as a hyphen, at most 63 characters; "node" if nothing is left."""
    name = re.sub(r"[^A-Za-z0-9.-]", "-", node)[:63].strip("-.")
    return name or "node"


def named(node: str, argv: list[str]) -> list[str]:
    """``argv`` run in a new UTS namespace whose hostname is :func:`hostname_for` ``node`` (the same process:
    ``unshare`` and the shell exec into it)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname_for(node), *argv]
