"""utils/workbench/junit_report.py on a report pytest itself writes."""

import subprocess
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "utils"))
from workbench import junit_report  # noqa: E402


TESTS = """\
import pytest

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

def test_fails_in_teardown(broken_teardown):
    pass
"""


def test_outcomes_of_a_pytest_report(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS, encoding="utf-8")
    report = tmp_path / "report.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={report}",
        "test_sample.py",
    ]
    subprocess.run(command, cwd=tmp_path, capture_output=True, check=False, timeout=120)
    cases = junit_report.test_cases(report)
    # a test that passed and then failed in its teardown: one <testcase> with an <error>
    assert [(c["test"], c["outcome"]) for c in cases] == [
        ("test_sample::test_passes", "passed"),
        ("test_sample::test_fails", "failed"),
        ("test_sample::test_skipped", "skipped"),
        ("test_sample::test_fails_in_teardown", "error"),
    ]
    assert "one is not two" in cases[1]["message"] and cases[2]["message"] == "not here"
    assert junit_report.test_cases(tmp_path / "missing.xml") == []
