"""The classroom labs that need the lab VM's kernel (RED/ECN step marking, DCTCP, the plug qdisc for PFC, rxe
and netem): each lab's own runs, checked by its own statements, as `sudo testbed lab run N` does there (30-60 s
each in the software-emulated VM). A lab whose check fails is run once more and the second check judged (one noisy
run of an emulated CPU is not a broken lab)."""

from __future__ import annotations

import pytest

from testbed.commands import labs as classlabs

from testbed.kernel import doctor


@pytest.mark.parametrize("ref", ["03", "05", "09"])
def test_a_vm_lab_passes_its_own_check(tmp_path, ref):
    lab = classlabs.find(ref)
    missing = doctor.missing(classlabs.needs(lab))
    assert not missing, f"lab {lab.ref} needs {', '.join(missing)}, which this kernel lacks"
    out = tmp_path / "first"
    status = classlabs.run(lab, out)
    if status != 0:
        print(f"lab {lab.ref}: check exited {status}; running the lab once more")
        out = tmp_path / "again"
        status = classlabs.run(lab, out)
    assert status == 0
