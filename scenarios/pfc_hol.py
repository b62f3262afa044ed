#!/usr/bin/env python3
"""PFC head-of-line blocking: an incast in a lossless class and a victim flow to an idle receiver.

    sudo .venv/bin/python scenarios/pfc_hol.py [--set mode=lossless_ecn] [--out DIR]

Same as `sudo testbed run pfc-hol`.
"""

import sys

from testbed.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", "pfc-hol", *sys.argv[1:]]))
