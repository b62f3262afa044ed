"""DCQCN's reference model (traffic/dcqcn.py) against the paper's rules (Zhu et al., SIGCOMM 2015): the cut, the
alpha update and decay, fast recovery, additive and hyper increase, the minimum rate, one cut and one CNP per
interval, EDT pacing, and the lazy catch-up giving what step-by-step evaluation gives. Pure logic: deterministic,
no timing involved. The eBPF source that mirrors the model is compiled here (clang) and its constants compared;
loading it on rxe traffic is a lab-VM test of the next step."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from traffic.dcqcn import (ALPHA_ONE, G_UNIT, MAX_CATCHUP, MAX_ROUNDS, NotificationPoint, Params, ReactionPoint,
                           alpha_decay, scaled)

MS = 1_000_000


def params(**kw) -> Params:
    base = {"line_rate_kbps": 10_000, "min_rate_kbps": 100, "ai_rate_kbps": 100, "hai_rate_kbps": 1000, "g": 4,
            "alpha_timer_ns": 5 * MS, "increase_timer_ns": 5 * MS, "byte_reset": 1_000_000_000, "threshold": 5,
            "cnp_interval_ns": 4 * MS, "cut_interval_ns": 4 * MS}
    return Params(**{**base, **kw})


def test_a_cut_at_alpha_one_halves_the_rate_and_keeps_the_old_rate_as_target():
    rp = ReactionPoint(params())
    assert rp.alpha == ALPHA_ONE and rp.rc_kbps == 10_000
    assert rp.on_cnp(1 * MS)
    assert (rp.rc_kbps, rp.rt_kbps) == (5000, 10_000)
    assert rp.alpha == ALPHA_ONE  # (1 - g) * 1 + g
    assert rp.on_cnp(5 * MS)  # one cut interval later: halves again, from the current rate
    assert (rp.rc_kbps, rp.rt_kbps, rp.rate_cuts) == (2500, 5000, 2)


def test_a_smaller_alpha_cuts_less():
    rp = ReactionPoint(params(initial_alpha=512))  # alpha = 1/2: Rc * (1 - 1/4)
    rp.on_cnp(0)
    assert rp.rc_kbps == 7500


def test_alpha_decays_by_one_minus_g_per_alpha_timer_without_cnp():
    p = params(increase_timer_ns=10**12)
    rp = ReactionPoint(p)
    rp.on_cnp(0)
    rp.advance(p.alpha_timer_ns - 1)
    assert rp.alpha == ALPHA_ONE  # not a whole period yet
    for k in (1, 2, 10, 100, 1000):
        rp.advance(k * p.alpha_timer_ns)
        assert rp.alpha / ALPHA_ONE == pytest.approx((1 - 4 / 1024) ** k, rel=1e-4, abs=1e-5)
    # a CNP restarts the period: no decay until K after it
    rp.on_cnp(1000 * p.alpha_timer_ns + 1)
    a = rp.alpha
    rp.advance(1001 * p.alpha_timer_ns)
    assert rp.alpha == a


def test_alpha_decay_by_squaring_matches_repeated_multiplication():
    a = ALPHA_ONE
    for n in range(1, 200):
        a = a * ((1024 - 4) << 10) >> 20
        assert abs(alpha_decay(ALPHA_ONE, 4, n) - a) <= n  # each product rounds down by less than 1 unit
    assert alpha_decay(ALPHA_ONE, 4, 2**40) == 0


def test_fast_recovery_closes_the_gap_to_the_target_in_f_steps_without_moving_the_target():
    p = params()
    rp = ReactionPoint(p)
    rp.on_cnp(0)
    rp.on_cnp(p.cut_interval_ns)  # Rc 2500, Rt 5000: below the line rate, so increases are visible
    t0 = p.cut_interval_ns
    gap0 = rp.rt_kbps - rp.rc_kbps
    for i in range(1, p.threshold + 1):
        rp.advance(t0 + i * p.increase_timer_ns)
        assert rp.rt_kbps == 5000 and rp.phase() in ("fast", "additive")
        assert rp.rt_kbps - rp.rc_kbps == gap0 >> i  # halves each step (Rc rounded up)
    assert rp.rt_kbps - rp.rc_kbps == gap0 // 2**p.threshold == 78
    rp.advance(t0 + (p.threshold + 1) * p.increase_timer_ns)  # the F+1-th event: additive increase
    assert rp.rt_kbps == 5000 + p.ai_rate_kbps


def test_additive_then_hyper_increase_follow_the_two_counters():
    p = params(byte_reset=1000, increase_timer_ns=10 * MS)
    rp = ReactionPoint(p)
    rp.on_cnp(0)
    rp.on_cnp(p.cut_interval_ns)
    t = p.cut_interval_ns
    steps = []
    for _ in range(6):  # byte-counter events 1..5: fast recovery; the 6th: additive (max > F, min <= F)
        rt = rp.rt_kbps
        rp.on_sent(t, 1000)
        steps.append(rp.rt_kbps - rt)
    assert steps == [0] * 5 + [p.ai_rate_kbps]
    steps = []
    for i in range(1, 7):  # timer events 1..5: additive (bc is past F); the 6th: both past F, hyper increase
        rt = rp.rt_kbps
        rp.advance(t + i * p.increase_timer_ns)
        steps.append(rp.rt_kbps - rt)
    assert steps == [p.ai_rate_kbps] * 5 + [p.hai_rate_kbps]
    assert rp.phase() == "hyper"


def test_rates_never_exceed_the_line_rate():
    p = params(byte_reset=1000)
    rp = ReactionPoint(p)
    rp.on_cnp(0)
    for i in range(1, 400):
        rp.on_sent(i * MS, 1500)
    assert rp.rt_kbps == rp.rc_kbps == p.line_rate_kbps


def test_the_minimum_rate_is_a_floor():
    p = params()
    rp = ReactionPoint(p)
    for i in range(20):
        rp.on_cnp(i * p.cut_interval_ns)
        assert rp.rc_kbps >= p.min_rate_kbps
    assert rp.rc_kbps == p.min_rate_kbps and rp.rate_cuts == 20


def test_at_most_one_cut_per_cut_interval():
    p = params()
    rp = ReactionPoint(p)
    assert rp.on_cnp(0)
    assert not rp.on_cnp(p.cut_interval_ns // 2)
    assert not rp.on_cnp(p.cut_interval_ns - 1)
    assert rp.rc_kbps == 5000 and rp.cnp_ignored == 2 and rp.cnp_received == 3
    assert rp.on_cnp(p.cut_interval_ns)
    assert rp.rate_cuts == 2 and rp.rc_kbps == 2500


def test_the_np_sends_at_most_one_cnp_per_qp_per_interval():
    np_ = NotificationPoint(cnp_interval_ns=4 * MS)
    sent = [np_.on_ce(t, 17) for t in (0, 1 * MS, 3 * MS, 4 * MS, 5 * MS, 8 * MS)]
    assert sent == [True, False, False, True, False, True]
    assert np_.on_ce(5 * MS, 18)  # another QP has its own interval
    assert (np_.ce_seen, np_.cnp_sent, np_.cnp_suppressed) == (7, 4, 3)


def test_departures_are_spaced_by_the_packet_time_at_the_current_rate():
    rp = ReactionPoint(params())
    assert rp.departure(0, 1250) == 0
    assert rp.departure(0, 1250) == 1 * MS  # 10 kbit at 10 Mbit/s
    rp.on_cnp(0)  # 5 Mbit/s now
    assert rp.departure(0, 1250) == 2 * MS
    assert rp.departure(0, 1250) == 4 * MS
    assert rp.departure(10 * MS, 1250) == 10 * MS  # an idle QP does not bank credit


@pytest.mark.parametrize("cuts,byte_events", [(1, 0), (3, 0), (6, 0), (6, 8), (10, 20)])
def test_a_long_idle_gap_jumped_in_closed_form_equals_step_by_step(cuts, byte_events):
    p = params(byte_reset=1000, ai_rate_kbps=10, hai_rate_kbps=50)
    fast, exact = ReactionPoint(p), ReactionPoint(p, max_catchup=10**9)
    for rp in (fast, exact):
        for i in range(cuts):
            rp.on_cnp(i * p.cut_interval_ns)
        rp.on_sent(cuts * p.cut_interval_ns, byte_events * 1000)
    for t in (1, 2, 5, 20):
        for rp in (fast, exact):
            rp.advance(t * 1000 * MS)
        assert (fast.rc_kbps, fast.rt_kbps, fast.t_count) == (exact.rc_kbps, exact.rt_kbps, exact.t_count)
        assert fast.dropped_events == 0


def test_scaled_parameters_follow_the_line_rate_and_the_time_scale():
    p = scaled(10)
    assert p.line_rate_kbps == 10_000 and p.ai_rate_kbps == 10 and p.min_rate_kbps == 100
    assert p.cnp_interval_ns == 5 * MS and p.alpha_timer_ns == p.increase_timer_ns == 5_500_000
    assert p.byte_reset == 250_000  # 10 MB at 40 Gbit/s is 2 ms; times 100 at 10 Mbit/s
    assert scaled(20).byte_reset == 2 * p.byte_reset and scaled(20).cnp_interval_ns == p.cnp_interval_ns
    assert scaled(1).ai_rate_kbps == 1


@pytest.mark.parametrize("kw,match", [({"min_rate_kbps": 0}, "min_rate_kbps"), ({"g": 0}, "g"),
                                      ({"g": 1024}, "g"), ({"byte_reset": 0}, "byte_reset"),
                                      ({"threshold": 0}, "threshold"), ({"initial_alpha": 2000}, "initial_alpha")])
def test_bad_parameters_are_refused_with_their_name(kw, match):
    with pytest.raises(ValueError, match=match):
        params(**kw)
    with pytest.raises(ValueError, match="line_rate_mbps"):
        scaled(0)


# --- the eBPF programs (testbed/kernel/dcqcn.bpf.c): they compile, and share the model's constants --------------

BPF_SOURCE = Path(__file__).resolve().parents[2] / "testbed" / "kernel" / "dcqcn.bpf.c"


def _elf_symbols(path: Path) -> dict[str, int]:
    """Name -> st_info of the global symbols of a little-endian ELF64 object (what `readelf -s` lists)."""
    raw = path.read_bytes()
    assert raw[:4] == b"\x7fELF" and raw[4] == 2 and raw[5] == 1
    shoff, = struct.unpack_from("<Q", raw, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", raw, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", raw, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for _name, sh_type, _f, _a, off, size, link, _i, _al, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link]
        for j in range(size // entsize):
            st_name, st_info = struct.unpack_from("<IB", raw, off + j * entsize)
            start = strtab[4] + st_name
            out[raw[start:raw.index(b"\0", start)].decode()] = st_info
    return out


def test_the_bpf_source_compiles_with_both_programs_and_its_maps():
    from testbed.kernel.ebpf import compile_object

    syms = _elf_symbols(compile_object(BPF_SOURCE))
    STT_FUNC, STT_OBJECT, STB_GLOBAL = 2, 1, 1
    for prog in ("dcqcn_ingress", "dcqcn_egress"):
        assert syms.get(prog) == (STB_GLOBAL << 4) | STT_FUNC, prog
    for m in ("config", "qpmap", "rp", "np_last", "stats"):
        assert syms.get(m) == (STB_GLOBAL << 4) | STT_OBJECT, m


def test_the_bpf_code_uses_the_model_constants():
    text = BPF_SOURCE.read_text()
    defines = dict(re.findall(r"^#define (\w+) (.+)$", text, re.M))
    assert int(defines["MAX_CATCHUP"]) == MAX_CATCHUP and int(defines["MAX_ROUNDS"]) == MAX_ROUNDS
    assert int(defines["G_UNIT"]) == G_UNIT and defines["ALPHA_ONE"] == "(1U << 20)" and ALPHA_ONE == 1 << 20
