"""Re-measuring what a burn-in check flags, as an operator re-runs a failed check before pulling a server: on a
shared machine another process's bursts slow some measurements (a CPU timing, the tail of 40 echoes), a real fault
(a throttled CPU, a jittery link) every one. A flagged target is measured again, up to ``TIMINGS`` times in all,
``PAUSE_S`` apart, and keeps its best; the run's facts list every re-measurement."""

from __future__ import annotations

import math
import time

from analysis.burnin import judge, median_or_nan, p99_or_nan

#: measurements of a flagged target in all, and the pause before each again: a CI run's healthy h2 was slow in two
#: CPU timings 0.7 s apart (74 ms against its peers' 45; the two peers timed between them were not), so another
#: process's bursts can outlast one re-timing; a throttle slows all
TIMINGS, PAUSE_S = 3, 1.0


def retried(measure, targets: list[str], flagged, key=lambda v: v, timings: int = TIMINGS,
            pause=lambda: time.sleep(PAUSE_S)) -> tuple[dict, dict[str, list]]:
    """``measure(targets) -> {target: value}``, then, while ``flagged(values)`` names targets and fewer than
    ``timings`` measurements were made, ``pause()`` and measure only those again; each keeps its lowest by ``key``
    (an operator re-runs a failed check before pulling a server: a shared machine's bursts hit some measurements, a
    real fault every one). Returns (values, each re-measured target's measurements in order)."""
    values = dict(measure(list(targets)))
    again: dict[str, list] = {}
    for _ in range(timings - 1):
        bad = [t for t in targets if t in set(flagged(values))]
        if not bad:
            break
        pause()
        new = measure(bad)
        for t in bad:
            again.setdefault(t, [values[t]]).append(new[t])
            values[t] = min(again[t], key=key)
    return values, again


def retimed(time_ms, hosts: list[str], timings: int = TIMINGS,
            pause=lambda: time.sleep(PAUSE_S)) -> tuple[dict[str, float], dict[str, list[float]]]:
    """:meth:`~testbed.commands.burnin_battery.CpuWorkers.times_ms` with ``time_ms`` (host -> ms) as the timer and
    ``pause`` between re-timings."""
    return retried(lambda hs: {h: time_ms(h) for h in hs}, hosts,
                   lambda v: [c.target for c in judge("cpu_task_ms", v) if c.flagged], timings=timings, pause=pause)


def rtt_flagged(rtts: dict[str, list[float]]) -> list[str]:
    """The senders whose echo RTTs analysis.burnin flags (median or p99)."""
    return [c.target for metric, stat in (("rtt_ms_p50", median_or_nan), ("rtt_ms_p99", p99_or_nan))
            for c in judge(metric, {h: stat(v) for h, v in rtts.items()}) if c.flagged]


def repinged(ping, pairs: list[tuple[str, str]], timings: int = TIMINGS,
             pause=lambda: time.sleep(PAUSE_S)) -> tuple[dict[str, list[float]], dict[str, list[list[float]]]]:
    """:func:`~testbed.commands.burnin_battery.ping_rtts` (``ping(pairs)``) for every pair, and again for a sender
    whose RTTs are flagged, keeping its echoes with the lowest p99: the p99 of 40 echoes is about their maximum, so
    one scheduling stall of the machine decides it (a host test's healthy h2 and h3 read 8.6 and 7.4 ms against
    their peers' 0.08, at once); a jittery or congested link stays slow every time."""
    peer = dict(pairs)

    def p99_key(v: list[float]) -> float:
        x = p99_or_nan(v)
        return x if math.isfinite(x) else math.inf
    return retried(lambda senders: ping([(a, peer[a]) for a in senders]), [a for a, _ in pairs], rtt_flagged,
                   key=p99_key, timings=timings, pause=pause)
