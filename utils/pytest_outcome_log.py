"""pytest plugin: ``--outcome-log FILE`` writes, at the end of the session, one JSON object: each test's outcome by node
id (passed, failed, error, skipped, xfailed, xpassed; an error in set-up or tear-down is ``error``, a failed call stays
``failed``), each file or folder that failed to collect, with the last line of its error, and how many tests were
collected (``--collect-only`` runs none). The tear-down error of the global-state guard
(``utils/pytest_global_state.py``: the test left state changed) does not change the outcome: the guard's own log names
that leak, so a leak is counted once, as a leak. Under pytest-xdist the controller writes it, from
the workers' reports. ``make open`` (``utils/workbench/opener.py``) reads it."""

import json
import re


_STATE = {"path": None, "tests": {}, "collect_errors": {}, "collected": 0}
GUARD_ERROR = "left process-global state changed"  # the guard's tear-down error


def pytest_addoption(parser):
    parser.addoption("--outcome-log", help="write each test's outcome and each collection error to this JSON file")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # an xdist worker reports to the controller, which writes
        _STATE["path"] = config.getoption("--outcome-log")


def cause(lines) -> str:
    """The error in pytest's lines: the last exception line (``ImportError: ...``), not the advice an exception's
    message goes on with (transformers' "Try: `pip install transformers -U`"); else the last line."""
    lines = [re.sub(r"^E\s+", "", line.strip()) for line in lines if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    return (errors or lines or [""])[-1]


def pytest_collectreport(report):
    if report.failed:
        _STATE["collect_errors"][report.nodeid] = cause(str(report.longrepr).splitlines()) or "failed"


def pytest_collection_finish(session):
    _STATE["collected"] = len(session.items)


def pytest_runtest_logreport(report):
    tests = _STATE["tests"]
    xfail = hasattr(report, "wasxfail")
    if report.failed and report.when == "teardown" and GUARD_ERROR in str(report.longrepr):
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "xfailed" if xfail else "skipped"
    elif report.when == "call":
        outcome = "xpassed" if xfail else "passed"
    else:
        return
    if tests.get(report.nodeid) not in ("failed", "error"):
        tests[report.nodeid] = outcome


def pytest_sessionfinish(session):
    if _STATE["path"]:
        data = {"tests": _STATE["tests"], "collect_errors": _STATE["collect_errors"], "collected": _STATE["collected"]}
        with open(_STATE["path"], "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
