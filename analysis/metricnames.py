"""The metric names a run's summary.json can hold: what a lab's statement (labs/NN/lab.toml ``metric`` / ``per``)
may name, checked when the lab loads so that a typo is one line, not a statement that never finds its value.

Two parts: the names one writer or another puts in summary.json (:data:`NAMES`, grouped by who writes them), and
families whose members depend on the run (:data:`FAMILIES`: a percentile of a distribution, a parallelism
dimension, the capture's wire counters, the RDMA devices' counters). :func:`known` is the test.

Who writes what: analysis.summary (recomputed from the run's files), testbed.workloads.collective (the collective
job), scenarios/*.py (incast, dctcp, pfc-hol, program, smoke), testbed.pfc.controller (PFC), testbed.measure
(fidelity, sampler, capture), analysis.faults (faults' effects), testbed.network.cluster (servers),
analysis.burnin (the burn-in battery), analysis.canary (a canary's decision: scenarios/canary.py, testbed canary),
scenarios/jobs.py (several jobs: job_NAME_...)."""

from __future__ import annotations

import re

__all__ = ["FAMILIES", "NAMES", "known"]

_PCT = r"(p50|p95|p99|p999|max|mean)"

#: name patterns of metric families (full match)
FAMILIES: tuple[str, ...] = (
    rf"cct_ms_{_PCT}", rf"cct_us_{_PCT}", rf"step_ms_{_PCT}", rf"round_ms_{_PCT}",
    r"comm_ms_[a-z]+", r"comm_fraction_[a-z]+",          # per parallelism dimension (analysis.dimensions)
    r"wire_[a-z0-9_]+",                                   # the packet capture's counters (analysis.capture)
    r"rdma_[a-z0-9_]+",                                   # RDMA devices' recovery counters
    r"pfc_[a-z0-9_]+",                                    # the PFC controller
    # DCQCN's counters and rates (analysis.dcqcn); dcqcn_jain_last: Jain's index of the flows' Rc, mean over the
    # last third of the 0.5 s bins in which two flows or more were sending (their rate state changed), idle bins out;
    # dcqcn_stagger_s, dcqcn_convergence_s, dcqcn_joint_bins, dcqcn_jain_join: flows that start apart
    # (analysis.dcqcn.convergence)
    r"dcqcn(_[a-z0-9_]+)?",
    r"uet_[a-z0-9_]+",                                    # UET's counters, uet_trimmed_unanswered (analysis.uet)
    r"sampler_[a-z0-9_]+",                                # the queue sampler's own timing
    rf"job_[A-Za-z][A-Za-z0-9_-]*_(step_ms|cct_ms)_{_PCT}",  # each job of a jobs run (scenarios/jobs.py)
    r"job_[A-Za-z][A-Za-z0-9_-]*_(overlap|leaves|bound_ms)",
)

_GROUPS = {
    "analysis.summary": """
        cct_samples ops_n step_n step_cv comm_wait_fraction nccl_size_bytes algbw_gbps busbw_gbps rounds_n
        round_goodput_mbps drops marks loss_rate ecn_mark_fraction backlog_peak_bytes queue_sample_times
        tcp_retrans_segs tcp_timeouts retransmit_rate pauses pause_fraction_max cpu_busy_mean flowlets
        flowlet_moved_fraction servers tunnel_datagrams tunnel_drops""",
    "the collective job": """
        bound_ms bound_payload_efficiency cct_vs_bound arrival_skew_vs_bound transfer_vs_bound arrival_skew_ms_mean
        transfer_ms_mean step_bound_ms step_vs_bound time_vs_bound data_verified clock_uncertainty_us_max clock_servers
        job_s agent_cpu_s_max switch_drops host_nic_drops ecn_marks tcpinfo_total_retrans tcpinfo_rtt_ms_max
        tcpinfo_rto_ms_max background_flows bg_goodput_mbps queue_sample_interval_ms cpu_busy_fraction
        cpu_busy_ops_fraction cpu_busy_peak message_bytes ranks iterations warmup ops_per_iteration
        trace_compute_ms fabric_build_s""",
    "the scenarios": """
        goodput_mbps bottleneck_drops bottleneck_packets bottleneck_utilisation queue_max_packets queue_mean_bytes
        queue_mean_packets queue_median_packets queue_p90_packets queue_peak_bytes queue_ports_sampled queue_rows
        queue_samples queue_sample_interval_s round_ms_ideal incast_drops incast_goodput_mbps incast_loss_rate
        incast_retrans_segs incast_timeouts victim_goodput_mbps victim_fair_share_mbps victim_retrans_segs
        victim_share_ratio lossless_drops lossless_class_drops receiver_ce_packets program_s steps_reported
        exit_status shaper_rate_ratio shaper_sent_bytes k_packets""",
    "fidelity and faults": """
        fidelity_ok port_rate_ratio_min cpu_throttled_ms_kernel link_down_events routes_withdrawn_events
        route_reaction_ms_max fault_events fault_errors faults_not_reached stragglers straggler_factor
        throttled_ms_total storming_ms_total servers_unfaithful""",
    "burn-in (analysis.burnin)": """
        burnin_healthy burnin_flagged burnin_wall_s hosts_flagged links_flagged path_mbps_min path_mbps_median
        path_fraction_min path_vs_configured_min fabric_cct_vs_bound leaf_cct_vs_bound_max""",
    "canary (analysis.canary)": """
        rolled_back rolled_out rollout_verified readback_verified canary_ratio canary_ratio_low canary_ratio_high
        canary_job_ms_median control_job_ms_median canary_round_ms_p99 control_round_ms_p99 canary_runs
        control_runs canary_tcp_timeouts control_tcp_timeouts canary_port_drops control_port_drops decision_log""",
    "several jobs (scenarios/jobs.py, analysis.jobs.spine_ports)": """
        jobs_n spine_port_bytes shared_ports shared_port_bytes shared_port_drops""",
}

#: every fixed name, from the groups above
NAMES: frozenset[str] = frozenset(n for text in _GROUPS.values() for n in text.split())
_FAMILY_RE = re.compile("|".join(f"(?:{f})" for f in FAMILIES))


def known(name: str) -> bool:
    """Can summary.json (or the metrics recomputed from a run's files) hold a metric of this name?"""
    return name in NAMES or _FAMILY_RE.fullmatch(name) is not None
