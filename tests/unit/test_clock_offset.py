"""One clock across servers (analysis.clockoffset, analysis.clockalign): the offset from NTP-style exchanges with the
minimum-delay filter, against synthetic exchanges whose true offset is known. Pure logic."""

from __future__ import annotations

import csv
import random

import pytest

from analysis.clockalign import align_dir, applied
from analysis.clockoffset import ClockError, ClockModel, Exchange, between, estimate

TRUE_OFFSET_S = -12345.678901  # a guest booted 3.4 h after the host: its CLOCK_MONOTONIC is that far behind


def exchange(t0, d_fwd, turnaround, d_back, offset=TRUE_OFFSET_S, drift_ppm=0.0):
    """The four timestamps of one ping-pong over a path with these one-way delays (seconds)."""
    off = offset + drift_ppm * 1e-6 * t0
    t1 = t0 + d_fwd + off
    t2 = t1 + turnaround
    t3 = t2 - off + d_back
    return Exchange(t0, t1, t2, t3)


def jittery(n, seed, base_s=50e-6, jitter_s=400e-6, **kw):
    """n exchanges 10 ms apart, each direction base + an exponential queueing delay (the shape of real jitter)."""
    rng = random.Random(seed)
    return [exchange(1000.0 + 0.01 * i, base_s + rng.expovariate(1 / jitter_s), 20e-6,
                     base_s + rng.expovariate(1 / jitter_s), **kw) for i in range(n)]


def test_symmetric_path_recovers_the_offset_within_its_bound():
    ex = jittery(200, seed=1)
    est = estimate(ex)
    assert abs(est.offset_s - TRUE_OFFSET_S) <= est.uncertainty_s
    # the fastest exchanges had ~2 x 50 us on the wire: the bound is about half of that, not the jitter's 400 us
    assert est.uncertainty_s < 60e-6, est
    assert est.delay_min_s == pytest.approx(min(e.delay_s for e in ex))
    assert (est.n, est.n_kept, est.n_invalid) == (200, 20, 0)


def test_an_asymmetric_path_biases_the_centre_but_stays_inside_the_bound():
    # forward always 300 us slower than back (a queue on one direction): theta is off by 150 us, a bias no number
    # of exchanges removes; the bound must still contain the truth, and be at least that wide.
    ex = [exchange(1.0 + i, 350e-6, 10e-6, 50e-6) for i in range(20)]
    est = estimate(ex)
    assert est.offset_s - TRUE_OFFSET_S == pytest.approx(150e-6, abs=1e-9)
    assert abs(est.offset_s - TRUE_OFFSET_S) <= est.uncertainty_s + 1e-12
    assert est.uncertainty_s == pytest.approx(200e-6, abs=1e-9)


def test_slow_exchanges_are_filtered_out_not_averaged_in():
    # 90% of exchanges hit a one-sided 5 ms stall: a mean of the centres would be ~2.5 ms off
    rng = random.Random(7)
    ex = []
    for i in range(100):
        stall = 5e-3 if i % 10 else 0.0
        ex.append(exchange(10.0 + i * 0.01, 40e-6 + stall + rng.uniform(0, 5e-6), 15e-6, 40e-6))
    mean_theta = sum(e.theta_s for e in ex) / len(ex)
    assert abs(mean_theta - TRUE_OFFSET_S) > 2e-3
    est = estimate(ex)
    # the ten unstalled exchanges took ~80 us round trip: the bound is half that, the centre within 10 us
    assert abs(est.offset_s - TRUE_OFFSET_S) < 10e-6 and est.uncertainty_s < 45e-6, est
    assert est.n_kept == 10 and est.delay_min_s < 90e-6


def test_non_causal_and_non_finite_exchanges_are_dropped_and_counted():
    ex = jittery(30, seed=3)
    bad = [Exchange(5.0, 1.0, 0.5, 6.0), Exchange(5.0, 1.0, 2.0, 4.0), Exchange(float("nan"), 1.0, 2.0, 6.0),
           (1.0, TRUE_OFFSET_S + 1.5, TRUE_OFFSET_S + 1.0, 3.0)]   # a tuple is taken as (t0, t1, t2, t3)
    est = estimate(ex + bad)
    assert est.n_invalid == 4 and est.n == 30
    assert abs(est.offset_s - TRUE_OFFSET_S) <= est.uncertainty_s


def test_nothing_valid_is_one_clear_error():
    with pytest.raises(ClockError, match="no valid clock exchange among 2"):
        estimate([Exchange(5.0, 1.0, 0.5, 6.0), Exchange(5.0, 1.0, 2.0, 4.0)])
    with pytest.raises(ClockError, match="keep_fraction"):
        estimate(jittery(5, seed=1), keep_fraction=0)


def test_a_clock_that_moves_during_the_exchanges_widens_the_bound():
    # the kept bounds contradict each other (a 1 ms step halfway): the estimate falls back to the centres' median
    # and its uncertainty grows by their spread, so it still covers the offset at either side of the step
    ex = [exchange(1.0 + i, 30e-6, 10e-6, 30e-6, offset=TRUE_OFFSET_S + (1e-3 if i >= 3 else 0.0)) for i in range(6)]
    est = estimate(ex, keep_fraction=1.0)
    assert est.spread_s == pytest.approx(1e-3, abs=1e-9)
    for truth in (TRUE_OFFSET_S, TRUE_OFFSET_S + 1e-3):
        assert abs(est.offset_s - truth) <= est.uncertainty_s


def test_drift_between_start_and_end_is_interpolated():
    # 80 ppm over 100 s is 8 ms: a constant offset would misplace the end of the run by that much
    start = estimate([exchange(1000.0 + 0.01 * i, 40e-6, 10e-6, 40e-6, drift_ppm=80) for i in range(20)])
    end = estimate([exchange(1100.0 + 0.01 * i, 40e-6, 10e-6, 40e-6, drift_ppm=80) for i in range(20)])
    model = between(start, end)
    assert model.drift_ppm == pytest.approx(80, rel=1e-3)
    # both bounds are ~40 us over 100 s: the drift is known to within ~0.8 ppm of what it is
    assert 80 < model.drift_bound_ppm < 81 and ClockModel(start).drift_bound_ppm == float("inf")
    t_ref = 1050.0
    t_server = t_ref + TRUE_OFFSET_S + 80e-6 * t_ref
    assert model.to_reference(t_server) == pytest.approx(t_ref, abs=1e-6)
    assert ClockModel(start).to_reference(t_server) - t_ref == pytest.approx(4e-3, abs=1e-5)
    assert ClockModel.from_dict(model.as_dict()) == model


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_align_dir_moves_time_points_only_and_refuses_twice(tmp_path):
    model = ClockModel(estimate([exchange(1.0 + i, 30e-6, 10e-6, 30e-6) for i in range(5)]))
    server = lambda t: t + TRUE_OFFSET_S  # noqa: E731
    write_csv(tmp_path / "queues.csv", ["t_s", "node", "backlog_bytes"], [[f"{server(20.5):.6f}", "leaf1", "1500"]])
    write_csv(tmp_path / "ops.csv", ["start_s", "end_s", "wait_s", "iter_start_s", "rank"],
              [[f"{server(21.0):.6f}", f"{server(21.25):.6f}", "0.125", "", "3"]])
    write_csv(tmp_path / "ports.csv", ["node", "port", "rate_mbps"], [["leaf1", "eth1", "10"]])
    before = (tmp_path / "ports.csv").read_text()
    done = align_dir(tmp_path, model)
    assert done == {"ops.csv": 1, "ports.csv": 0, "queues.csv": 1}
    q, o = read_csv(tmp_path / "queues.csv")[0], read_csv(tmp_path / "ops.csv")[0]
    assert float(q["t_s"]) == pytest.approx(20.5, abs=2e-6) and q["backlog_bytes"] == "1500"
    assert float(o["start_s"]) == pytest.approx(21.0, abs=2e-6) and float(o["end_s"]) == pytest.approx(21.25, abs=2e-6)
    assert o["wait_s"] == "0.125" and o["iter_start_s"] == "" and o["rank"] == "3"   # durations and blanks kept
    assert (tmp_path / "ports.csv").read_text() == before
    assert applied(tmp_path) == model
    with pytest.raises(ClockError, match="already"):
        align_dir(tmp_path, model)
    assert float(read_csv(tmp_path / "queues.csv")[0]["t_s"]) == pytest.approx(20.5, abs=2e-6)


def test_align_dir_names_the_cell_that_does_not_parse_and_shifts_nothing(tmp_path):
    """A bad cell in a later file must not leave the earlier ones shifted without a clock.json (a second attempt
    would shift them twice)."""
    write_csv(tmp_path / "events.csv", ["t_s", "kind"], [["5.0", "netem_set"]])
    write_csv(tmp_path / "pfc.csv", ["t_s", "node"], [["1.0", "leaf1"], ["soon", "leaf2"]])
    before = (tmp_path / "events.csv").read_text()
    with pytest.raises(ClockError, match=r"pfc.csv:3: t_s is not a number \('soon'\)"):
        align_dir(tmp_path, ClockModel(estimate([(0.0, 1.0, 1.0, 0.001)])))
    assert applied(tmp_path) is None
    assert (tmp_path / "events.csv").read_text() == before


def test_every_time_point_file_of_a_run_directory_is_known():
    """flows.csv, program.csv and dcqcn_rates.csv carry time points too (docs/rundir.md)."""
    from analysis.clockalign import TIME_POINT_COLUMNS
    assert TIME_POINT_COLUMNS["flows"] == ("start_s", "end_s") and TIME_POINT_COLUMNS["program"] == ("end_s",)
    assert TIME_POINT_COLUMNS["dcqcn_rates"] == ("t_s",)
