"""In the lab VM doctor finds every capability (and its verdicts still match the stock tools: the host test module
tests/host/test_doctor_verdicts.py is collected in the VM session too; both use the session's one doctor run, the
`report` fixture of tests/conftest.py)."""


def test_everything_present_in_the_lab_vm(report):
    missing = [c["name"] for c in report["checks"] if not c["ok"]]
    assert report["all_ok"] and not missing, f"lab VM kernel lacks: {missing}"
    assert report["in_lab_vm"]
