"""PFC (802.1Qbb) emulation: the pause controller, its set-up per run, and pause frames on the wire."""
