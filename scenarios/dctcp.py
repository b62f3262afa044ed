#!/usr/bin/env python3
"""DCTCP vs TCP queue occupancy on a dumbbell (same as `sudo testbed run dctcp`).

    sudo .venv/bin/python scenarios/dctcp.py                                   # DCTCP, step marking at K
    sudo .venv/bin/python scenarios/dctcp.py --set cc=cubic --set discipline=droptail --set ecn=false
"""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "dctcp", *sys.argv[1:]]))
