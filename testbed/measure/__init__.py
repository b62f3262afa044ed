"""Watching a run: samplers, captures, kernel counter records, the fidelity verdict and the live view."""
