"""testbed.kernel.keyhold changes the loopback of the machine it runs on: it must refuse outside the lab VM."""

from testbed.kernel import keyhold


def test_the_key_holder_refuses_to_run_outside_the_lab_vm(monkeypatch, capsys):
    monkeypatch.delenv("TESTBED_IN_VM", raising=False)
    assert keyhold.main() == 2
    assert "only inside the lab VM" in capsys.readouterr().err


def test_the_guest_script_waits_for_the_file_the_holder_writes():
    """testbed.vm may not import testbed.kernel (the rooms' layers), so the ready file's name is written twice."""
    from testbed.vm import labvm

    assert labvm.KEYHOLD_READY == keyhold.READY_FILE
