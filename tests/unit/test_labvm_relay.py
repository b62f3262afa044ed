"""The line relay behind `testbed cli` in the lab VM: what the host appends to a file on the shared folder reaches
the guest command's stdin (a FIFO) in order, and the host's end-of-input line becomes EOF there."""

import os
import threading
import time

from testbed.vm.relay import appended, relay


def test_relay_passes_lines_in_order_and_eot_becomes_eof(tmp_path):
    src, fifo = tmp_path / "stdin", tmp_path / "fifo"
    os.mkfifo(fifo)
    src.write_bytes(b"pingall\n")
    t = threading.Thread(target=relay, args=(str(src), str(fifo)), daemon=True)
    t.start()
    with open(fifo, "rb") as r:
        time.sleep(0.3)
        with open(src, "ab") as f:
            f.write(b"h1 ping -c1 h4\n\x04\n")
        assert r.read() == b"pingall\nh1 ping -c1 h4\n"  # read() returns: the relay closed its end
    t.join(timeout=5)
    assert not t.is_alive()


def test_appended_reads_past_an_offset(tmp_path):
    p = tmp_path / "out"
    assert appended(p, 0) == b""  # no file yet
    p.write_bytes(b"abcdef")
    assert appended(p, 2) == b"cdef" and appended(p, 6) == b""
