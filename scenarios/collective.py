#!/usr/bin/env python3
"""Collectives with real data over kernel TCP on a leaf-spine fabric, one agent process per host.

    sudo .venv/bin/python scenarios/collective.py [--set collective=allreduce] [--set size=1K,64K,1M]
        [--set ranks=4] [--set iterations=10] [--set stragglers=1 --set straggler_factor=3 --set compute_ms=50]
        [--set background=h1>h3] [--out DIR]

Same as `sudo testbed run collective`.
"""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "collective", *sys.argv[1:]]))
