#!/usr/bin/env python3
"""Smoke test of the real kernel: N senders x B bytes to one receiver at the same instant, R rounds (TCP incast).

    sudo .venv/bin/python scenarios/incast.py [--set senders=8] [--set buffer_bytes=64K] [--out DIR]

Same as `sudo testbed run incast`.
"""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "incast", *sys.argv[1:]]))
