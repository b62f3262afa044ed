"""The lab VM's file relay: how a command in the guest streams its output to this terminal and reads what is typed
here, over the 9p share (no sockets between host and guest: the guest has no network of ours). Polled, since 9p has
no inotify."""

from __future__ import annotations

import shlex
import sys
import threading
import time
from pathlib import Path


def appended(path: Path | str, pos: int) -> bytes:
    """What was written to ``path`` past offset ``pos`` (b"" when nothing, or no file yet). Files on the 9p share
    are polled: 9p has no inotify."""
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            return f.read()
    except FileNotFoundError:
        return b""


def relay(src: str, dst: str) -> None:
    """Runs in the guest (``testbed cli`` in the VM): copies what the host appends to ``src`` into the command's
    stdin ``dst`` (a FIFO); a line holding only EOT (the host's end of input) closes it, so the command sees EOF."""
    out = open(dst, "wb", buffering=0)
    pos = 0
    while True:
        data = appended(src, pos)
        if data:
            pos += len(data)
            eot = data.endswith(b"\x04\n")
            try:
                out.write(data[:-2] if eot else data)
            except BrokenPipeError:
                return
            if eot:
                return
        time.sleep(0.1)


def stream(path: Path, sink, stop: threading.Event) -> None:
    """Copy what the guest appends to `path` onto `sink` until `stop` is set and the file is drained."""
    pos = 0
    while True:
        done = stop.is_set()
        data = appended(path, pos)
        if data:
            pos += len(data)
            sink.buffer.write(data)
            sink.flush()
        if done:
            return
        time.sleep(0.2)


def guest_lines(results: Path, argv: list[str]) -> str:
    """Guest script lines for an interactive command: its stdin is a FIFO the relay fills from results/stdin."""
    q = lambda name: shlex.quote(str(results / name))  # noqa: E731
    code = shlex.quote("import sys; from testbed.vm.relay import relay; relay(sys.argv[1], sys.argv[2])")
    return (f"mkfifo /tmp/testbed-stdin\n{sys.executable} -c {code} {q('stdin')} /tmp/testbed-stdin &\n"
            f"{shlex.join(argv)} >{q('stdout')} 2>{q('stderr')} </tmp/testbed-stdin\n"
            f"echo $? > {q('rc')}\nkill $! 2>/dev/null\n")


def feed_stdin(path: Path, stop: threading.Event) -> None:
    """Append this terminal's input lines to ``path`` for the guest's relay; an EOT line at end of input."""
    with open(path, "ab", buffering=0) as f:
        for line in iter(sys.stdin.readline, ""):
            f.write(line.encode())
            if stop.is_set():
                return
        f.write(b"\x04\n")
