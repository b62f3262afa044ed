"""The UET transport's run options that a scenario checks before anything is built: how many entropy values a rank
sprays over, and how a SACK reveals a loss (traffic.uet.UetTransport takes both)."""

from __future__ import annotations

#: entropy values (UDP source ports) a rank sprays over unless told otherwise
ENTROPY_VALUES = 16
#: how a SACK reveals a loss (traffic.uet_tx._detect_losses): "path", per entropy value (path order, then a time
#: rule with the EV's own RTT), or "rack", RACK's time rule over the whole peer pair (before per-EV state)
LOSS_RULES = ("path", "rack")
LOSS_RULE = "path"


def entropy_values_problem(transport: str, entropy_values: int) -> str | None:
    """Why ``entropy_values`` cannot be set with ``transport`` (None: it can): only UET sprays over several source
    ports; a TCP connection keeps its one source port and RoCE its queue pair's."""
    if transport != "uet" and entropy_values != ENTROPY_VALUES:
        return (f"entropy_values={entropy_values} needs transport=uet (with transport={transport} a connection "
                "keeps its one source port)")
    return None
