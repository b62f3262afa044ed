"""Degraded fabrics: the fault plan (pure), the timeline that plays it, and faults of hosts."""
