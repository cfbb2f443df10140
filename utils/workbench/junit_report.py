"""The test cases of a pytest JUnit XML report (``--junitxml``): one reader for the workbench and the benches."""

from xml.etree import ElementTree


# The outcome of a test case by the first of these elements it holds (an error in tear-down after a failure: error)
OUTCOMES = {"error": "error", "failure": "failed", "skipped": "skipped"}


def test_cases(path) -> list[dict]:
    """One dict per ``<testcase>`` of the report at ``path``, in order: ``test`` (``classname::name``), ``file`` (or
    None), ``outcome`` (passed, failed, error or skipped), ``duration_s``, and, unless it passed, ``message`` and
    ``details_tail``. [] when the report is missing or unreadable (pytest did not get to write it)."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    cases = []
    for case in root.iter("testcase"):
        record = {
            "test": f"{case.get('classname')}::{case.get('name')}",
            "file": case.get("file"),
            "outcome": "passed",
            "duration_s": round(float(case.get("time") or 0), 3),
        }
        element = next((case.find(tag) for tag in OUTCOMES if case.find(tag) is not None), None)
        if element is not None:
            record["outcome"] = OUTCOMES[element.tag]
            record["message"] = (element.get("message") or "").strip()[:1000]
            record["details_tail"] = (element.text or "")[-1500:]
        cases.append(record)
    return cases
