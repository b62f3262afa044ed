"""testbed: a packet-level emulation lab for AI-cluster networking."""

__version__ = "0.1.0"
