"""Offline analysis of testbed run directories (docs/rundir.md, docs/analysis.md).

Reads only the run folder with pandas/numpy; never imports ``testbed``, ``topologies`` or ``traffic``.
``analysis.plots`` (matplotlib) is not imported here; import it explicitly when you need figures.
"""

from .load import IncompleteRunWarning, Run, RunDirError, load_run

__all__ = ["IncompleteRunWarning", "Run", "RunDirError", "load_run"]
