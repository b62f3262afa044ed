"""Where `testbed run` runs: the --vm decision (testbed.commands.runner.use_vm) and the capabilities a scenario's
parameters add (Scenario.needs_of). Pure logic: the doctor's verdicts are given as a function."""

import pytest

from testbed.errors import CapabilityMissing, UsageError
from testbed.commands.runner import use_vm
from testbed.scenario import get

COLL = get("collective")


def verdicts(lacking):
    calls = []

    def missing(needs):
        calls.append(list(needs))
        return [n for n in needs if n in lacking]
    return missing, calls


def params(**kw):
    p = {x.name: x.default for x in COLL.params}
    p.update(kw)
    return p


def test_rdma_adds_rxe_and_pyverbs():
    assert COLL.needs_of(params()) == ["qdisc:htb", "qdisc:bfifo"]
    assert COLL.needs_of(params(transport="rdma")) == ["qdisc:htb", "qdisc:bfifo", "rxe:netns", "pyverbs"]
    lossy = COLL.needs_of(params(transport="rdma", loss_percent=1.0))
    assert {"rxe:netns", "pyverbs", "qdisc:netem", "cls:u32", "act:mirred"} <= set(lossy)
    assert len(lossy) == len(set(lossy))
    assert "transport=rdma adds rxe:netns" in COLL.help()


def test_auto_boots_the_vm_exactly_when_something_is_missing():
    needs = COLL.needs_of(params(transport="rdma"))
    missing, calls = verdicts({"rxe:netns", "qdisc:netem"})  # this host: no rxe, no netem
    assert use_vm("auto", needs, in_vm=False, missing=missing) is True
    assert calls == [needs]
    missing, _ = verdicts({"qdisc:netem"})  # a kernel with rxe: a tcp or rdma run without loss stays here
    assert use_vm("auto", needs, in_vm=False, missing=missing) is False
    assert use_vm("auto", COLL.needs_of(params()), in_vm=False, missing=verdicts({"rxe:netns"})[0]) is False


def test_never_refuses_naming_the_capability():
    needs = COLL.needs_of(params(transport="rdma"))
    with pytest.raises(CapabilityMissing) as e:
        use_vm("never", needs, in_vm=False, missing=verdicts({"rxe:netns"})[0])
    assert isinstance(e.value, UsageError) and e.value.exit_status == 2
    assert str(e.value).startswith("missing capability: rxe:netns") and "\n" not in str(e.value)
    assert use_vm("never", needs, in_vm=False, missing=verdicts(set())[0]) is False


def test_always_does_not_ask_the_doctor():
    missing, calls = verdicts({"rxe:netns"})
    assert use_vm("always", ["rxe:netns"], in_vm=False, missing=missing) is True and calls == []


def test_inside_the_vm_it_runs_here_or_refuses():
    assert use_vm("auto", ["rxe:netns"], in_vm=True, missing=verdicts(set())[0]) is False
    assert use_vm("always", ["rxe:netns"], in_vm=True, missing=verdicts(set())[0]) is False  # no VM in a VM
    with pytest.raises(CapabilityMissing, match="rxe:netns"):
        use_vm("auto", ["qdisc:htb", "rxe:netns"], in_vm=True, missing=verdicts({"rxe:netns"})[0])


def test_capture_parameter_is_checked_before_anything():
    COLL.validate(params(capture="h1:eth0"))
    COLL.validate(params(capture="leaf1:spine2"))
    for bad, msg in (("h9:eth0", "unknown node 'h9'"), ("h1:eth7", "h1 has no port 'eth7'"),
                     ("h1", "expected NODE:IFNAME"), (":eth0", "expected NODE:IFNAME")):
        with pytest.raises(UsageError, match=msg):
            COLL.validate(params(capture=bad))
