"""Errors that end a command with one clear line.

`UsageError` (exit status 2) is raised for bad input and for a missing capability, always *before* anything is
created on the system. The CLI prints `testbed: <message>` and exits 2; it never prints a traceback for these.

`RunFailed` (exit status 1) is raised by a scenario whose run started and then failed (an agent error, a data
mismatch). Scenarios raise exceptions; only the CLI turns them into exit statuses, so a sweep can record the
point as failed and go on.
"""


class UsageError(Exception):
    """Bad input or an unusable environment, detected before any side effect. Exit status 2."""

    exit_status = 2


class RunFailed(Exception):
    """A run that started failed (its teardown still runs; its run directory keeps what it got). One line,
    exit status 1."""

    exit_status = 1


class KernelToolError(RuntimeError):
    """A kernel tool the lab reads counters with failed (``rdma statistic`` of an rxe device): the message is the
    tool's own. A RuntimeError, like the transport errors the same call raised before it had its own class."""


class CapabilityMissing(UsageError):
    """The running kernel or system lacks something the request needs (names the capability)."""

    def __init__(self, capability: str, hint: str = ""):
        self.capability = capability
        msg = f"missing capability: {capability}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


def require_root(what: str) -> None:
    """Refuse, with exit status 2, to do `what` without root."""
    import os

    if os.geteuid() != 0:
        raise UsageError(f"{what} needs root (run it with sudo)")
