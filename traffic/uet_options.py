"""The UET transport's run options that a scenario checks before anything is built: how many entropy values a rank
sprays over, and how a SACK reveals a loss (traffic.uet.UetTransport takes both)."""

from __future__ import annotations

#: entropy values (UDP source ports) a rank sprays over unless told otherwise
ENTROPY_VALUES = 16
#: how a SACK reveals a loss (traffic.uet_tx._detect_losses): "path", per entropy value (path order, then a time
#: rule with the EV's own RTT), or "rack", RACK's time rule over the whole peer pair (before per-EV state)
LOSS_RULES = ("path", "rack")
LOSS_RULE = "path"
#: what a run asks for: "auto" is "path" where an entropy value keeps one path (per-flow ECMP) and "rack" where the
#: fabric moves packets of one EV between paths (spray per packet, flowlet and adaptive balancing at idle gaps)
RUN_LOSS_RULES = ("auto", *LOSS_RULES)


def loss_rule_for(asked: str, load_balancing: str) -> str:
    """The transport's loss rule for a run that asked for ``asked`` (RUN_LOSS_RULES) on a fabric balanced by
    ``load_balancing``: the path-order rule holds only where one EV is one path (ECMP)."""
    if asked == "auto":
        return "path" if load_balancing == "ecmp" else "rack"
    return asked


def loss_rule_problem(transport: str, asked: str, load_balancing: str) -> str | None:
    """Why ``uet_loss_rule=asked`` cannot be run (None: it can): it is UET's, and "path" needs one path per EV."""
    if transport != "uet" and asked != "auto":
        return f"uet_loss_rule={asked} needs transport=uet"
    if asked == "path" and load_balancing != "ecmp":
        return (f"uet_loss_rule=path assumes one path per entropy value, which load_balancing={load_balancing} "
                "does not keep (use auto or rack)")
    return None


def entropy_values_problem(transport: str, entropy_values: int) -> str | None:
    """Why ``entropy_values`` cannot be set with ``transport`` (None: it can): only UET sprays over several source
    ports; a TCP connection keeps its one source port and RoCE its queue pair's."""
    if transport != "uet" and entropy_values != ENTROPY_VALUES:
        return (f"entropy_values={entropy_values} needs transport=uet (with transport={transport} a connection "
                "keeps its one source port)")
    return None
