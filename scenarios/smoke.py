#!/usr/bin/env python3
"""Smoke test of the real kernel: one TCP flow through one shaped switch port with a RED/ECN queue.

    sudo .venv/bin/python scenarios/smoke.py [--set rate_mbps=50] [--out DIR]

Same as `sudo testbed run smoke`.
"""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "smoke", *sys.argv[1:]]))
