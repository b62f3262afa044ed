"""Netlink encodings for the qdiscs and classifiers pyroute2 0.9 does not ship: red, bfifo, ets, flower, and
netem's Gilbert-Elliott loss model (pyroute2's netem has no TCA_NETEM_LOSS).

Importing this module registers them in pyroute2's tc plugin table, so `ipr.tc("add", "red", ...)` works like the
built-in kinds. Layouts follow include/uapi/linux/pkt_sched.h and pkt_cls.h.
"""

from __future__ import annotations

import math
import struct

from pyroute2.netlink import nla, nla_string
from pyroute2.netlink.rtnl import TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import plugins, sched_netem, sched_pfifo
from pyroute2.netlink.rtnl.tcmsg.common import red_eval_ewma, red_eval_idle_damping, red_eval_P, stats2 as _stats2

TC_RED_ECN = 1
TC_RED_HARDDROP = 2


class _red:
    """RED: random early detection with optional ECN marking (sch_red).

    Parameters (bytes): limit, min, max, probability (0..1], ecn (bool), harddrop (bool), avpkt (bytes),
    burst (packets), bandwidth (bytes/s, for idle damping). `instantaneous=True` sets the EWMA weight to 1
    (Wlog 0), so the "average" queue is the instantaneous one: with min=K and max just above K and probability 1,
    this is DCTCP-style step marking at K.
    """

    parent = TC_H_ROOT

    @staticmethod
    def get_parameters(kw):
        limit = int(kw["limit"])
        qmin, qmax = int(kw["min"]), int(kw["max"])
        prob = float(kw.get("probability", 0.02))
        avpkt = int(kw.get("avpkt", 1000))
        if not 0 < qmin < qmax <= limit:
            raise ValueError(f"red: need 0 < min < max <= limit (got {qmin}, {qmax}, {limit})")
        flags = (TC_RED_ECN if kw.get("ecn") else 0) | (TC_RED_HARDDROP if kw.get("harddrop") else 0)
        if kw.get("instantaneous"):
            wlog, scell, stab = 0, 0, [0] * 256
        else:
            burst = int(kw.get("burst") or math.ceil((2 * qmin + qmax) / (3 * avpkt)))
            wlog = red_eval_ewma(qmin, burst, avpkt)  # as iproute2's tc_red_eval_ewma
            if wlog < 0:
                raise ValueError(f"red: burst {burst} too small for min {qmin} B (try {1 + qmin // avpkt})")
            bw = float(kw.get("bandwidth", 12_500_000))
            scell, stab = red_eval_idle_damping(wlog, avpkt, bw)
        plog = red_eval_P(qmin, qmax, min(prob, 0.999999))
        max_p = 0xFFFFFFFF if prob >= 1.0 else int(prob * 2**32)
        opt = {"limit": limit, "qth_min": qmin, "qth_max": qmax, "Wlog": wlog, "Plog": max(plog, 0),
               "Scell_log": max(scell, 0), "flags": flags}
        return {"attrs": [["TCA_RED_PARMS", opt], ["TCA_RED_STAB", stab], ["TCA_RED_MAX_P", max_p]]}

    class options(nla):
        nla_map = (
            ("TCA_RED_UNSPEC", "none"),
            ("TCA_RED_PARMS", "qopt"),
            ("TCA_RED_STAB", "stab"),
            ("TCA_RED_MAX_P", "uint32"),
        )

        class qopt(nla):
            fields = (("limit", "I"), ("qth_min", "I"), ("qth_max", "I"), ("Wlog", "B"), ("Plog", "B"),
                      ("Scell_log", "B"), ("flags", "B"))

        class stab(nla_string):
            def encode(self):
                self["value"] = struct.pack("B" * 256, *(int(x) for x in self.value))
                nla_string.encode(self)

    class stats(nla):
        fields = (("early", "I"), ("pdrop", "I"), ("other", "I"), ("marked", "I"))

    class stats2(_stats2):
        class stats_app(nla):
            fields = (("early", "I"), ("pdrop", "I"), ("other", "I"), ("marked", "I"))


class _ets:
    """ETS (802.1Qaz enhanced transmission selection): `bands` bands, the first `strict` of them strict priority,
    the rest sharing by `quanta` (bytes per round, DRR). `priomap` maps skb priority 0..15 to a band."""

    parent = TC_H_ROOT

    @staticmethod
    def get_parameters(kw):
        bands = int(kw.get("bands", 2))
        strict = int(kw.get("strict", bands))
        quanta = list(kw.get("quanta", []))
        attrs = [["TCA_ETS_NBANDS", bands], ["TCA_ETS_NSTRICT", strict]]
        if quanta:
            attrs.append(["TCA_ETS_QUANTA", {"attrs": [["TCA_ETS_QUANTA_BAND", int(q)] for q in quanta]}])
        if "priomap" in kw:
            attrs.append(["TCA_ETS_PRIOMAP", {"attrs": [["TCA_ETS_PRIOMAP_BAND", int(b)] for b in kw["priomap"]]}])
        return {"attrs": attrs}

    class options(nla):
        nla_flags = 0x8000  # NLA_F_NESTED: sch_ets parses its options strictly
        nla_map = (
            ("TCA_ETS_UNSPEC", "none"),
            ("TCA_ETS_NBANDS", "uint8"),
            ("TCA_ETS_NSTRICT", "uint8"),
            ("TCA_ETS_QUANTA", "quanta"),
            ("TCA_ETS_QUANTA_BAND", "uint32"),
            ("TCA_ETS_PRIOMAP", "priomap"),
            ("TCA_ETS_PRIOMAP_BAND", "uint8"),
        )

        class quanta(nla):
            nla_flags = 0x8000
            nla_map = (("TCA_ETS_UNSPEC", "none"), ("TCA_ETS_NBANDS", "none"), ("TCA_ETS_NSTRICT", "none"),
                       ("TCA_ETS_QUANTA", "none"), ("TCA_ETS_QUANTA_BAND", "uint32"))

        class priomap(nla):
            nla_flags = 0x8000
            nla_map = (("TCA_ETS_UNSPEC", "none"), ("TCA_ETS_NBANDS", "none"), ("TCA_ETS_NSTRICT", "none"),
                       ("TCA_ETS_QUANTA", "none"), ("TCA_ETS_QUANTA_BAND", "none"), ("TCA_ETS_PRIOMAP", "none"),
                       ("TCA_ETS_PRIOMAP_BAND", "uint8"))


class _flower:
    """flower classifier, minimal: match by ethertype (the filter's protocol) and set a class id."""

    parent = TC_H_ROOT

    @staticmethod
    def fix_request(request):
        from socket import htons

        request["info"] = htons(request.get("protocol", 0x0003) & 0xFFFF) | (
            (request.get("prio", 0) << 16) & 0xFFFF0000)

    @staticmethod
    def get_parameters(kw):
        return {"attrs": [["TCA_FLOWER_CLASSID", int(kw.get("classid", 0x10001))]]}

    class options(nla):
        nla_map = (("TCA_FLOWER_UNSPEC", "none"), ("TCA_FLOWER_CLASSID", "uint32"))


def _module(cls):
    import types

    m = types.SimpleNamespace()
    for k in dir(cls):
        if not k.startswith("__"):
            setattr(m, k, getattr(cls, k))
    return m


class _netem:
    """netem as pyroute2 encodes it, plus ``ge=(p, r, h, k1)``: the Gilbert-Elliott loss model (TCA_NETEM_LOSS /
    NETEM_LOSS_GE, as ``tc ... loss gemodel``), each a probability in [0, 1]: p good->bad and r bad->good per packet,
    h the chance a packet is *kept* in the bad state, k1 the chance one is lost in the good state. The kernel
    (loss_gilb_ell in sch_netem.c) uses this model instead of ``loss`` while it is given."""

    parent = sched_netem.parent

    @staticmethod
    def get_parameters(kw):
        opts = sched_netem.get_parameters(kw)
        ge = kw.get("ge")
        if ge is not None:
            p, r, h, k1 = (min(0xFFFFFFFF, int(round(float(x) * 0xFFFFFFFF))) for x in ge)
            opts["loss"] = 0
            opts["attrs"].append(["TCA_NETEM_LOSS", {"attrs": [["NETEM_LOSS_GE", {"p": p, "r": r, "h": h,
                                                                                  "k1": k1}]]}])
        return opts

    class options(sched_netem.options):
        nla_map = tuple(("TCA_NETEM_LOSS", "netem_loss") if name == "TCA_NETEM_LOSS" else (name, kind)
                        for name, kind in sched_netem.options.nla_map)

        class netem_loss(nla):
            nla_map = (("NETEM_LOSS_UNSPEC", "none"), ("NETEM_LOSS_GI", "none"), ("NETEM_LOSS_GE", "gemodel"))

            class gemodel(nla):
                fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))


plugins["netem"] = _module(_netem)  # replaces pyroute2's: the same encoding, plus the loss model
plugins.setdefault("red", _module(_red))
plugins.setdefault("ets", _module(_ets))
plugins.setdefault("flower", _module(_flower))
plugins.setdefault("bfifo", sched_pfifo)


def _cached_calc_rtab():
    """pyroute2 computes an HTB class's two 256-entry rate tables in Python for every class it encodes (about a
    third of the encoding time of a fabric's queues, and every port of a fabric has the same few rates). Same
    inputs, same table: compute each once per process. (calc_rtab also records the cell log and alignment it used
    in the message; the cached path sets them the same way.)"""
    from pyroute2.netlink.rtnl.tcmsg.common import nla_plus_rtab

    parms = nla_plus_rtab.parms
    if getattr(parms.calc_rtab, "_testbed_cached", False):
        return
    original = parms.calc_rtab
    cache: dict[tuple, tuple[list, int, int]] = {}

    def calc_rtab(self, kind):
        key = (kind, self.get("mtu", 0), self[f"{kind}_cell_log"], self[f"{kind}_mpu"], self.get(kind, "rate"))
        hit = cache.get(key)
        if hit is None:
            rtab = original(self, kind)
            hit = cache[key] = (rtab, self[f"{kind}_cell_log"], self[f"{kind}_cell_align"])
        rtab, cell_log, cell_align = hit
        self[f"{kind}_cell_log"] = cell_log
        self[f"{kind}_cell_align"] = cell_align
        return list(rtab)

    calc_rtab._testbed_cached = True
    parms.calc_rtab = calc_rtab


_cached_calc_rtab()
