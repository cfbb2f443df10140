"""utils/census.py on synthetic test trees: runs them under the global-state guard from the tree's root and prints,
grouped by what changed, the tests that changed it; exit 2 on bad input."""

import os
import subprocess
import sys
from pathlib import Path


CENSUS = Path(__file__).resolve().parents[2] / "utils" / "census.py"

TESTS = """
import os
from pathlib import Path


def test_leaves_a_variable():
    os.environ["CENSUS_LEAK"] = "1"


def test_leaves_a_folder():
    Path("leftover").mkdir()


def test_also_leaves_the_variable():
    os.environ["CENSUS_LEAK"] = "2"


def test_clean():
    pass


def test_deselected():
    os.environ["CENSUS_DESELECTED"] = "1"
"""


def run_census(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "CENSUS_LEAK")}
    return subprocess.run(
        [sys.executable, str(CENSUS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_census_groups_the_tests_by_what_they_changed_from_the_trees_root(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "tests").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (project / "tests" / "test_leaks.py").write_text(TESTS, encoding="utf-8")

    result = run_census(str(project / "tests"), "--", "-k", "not deselected", cwd=elsewhere)

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "4 of 4 tests run, 3 left process-global state changed" in lines[0], result.stdout
    group = lines.index("environment: CENSUS_LEAK (2 tests)")
    assert lines[group + 1].startswith("  tests/test_leaks.py::test_also_leaves_the_variable  '<unset>' -> '2'")
    assert lines[group + 2].startswith("  tests/test_leaks.py::test_leaves_a_variable  '<unset>' -> '1'")
    folder = lines.index("files in the working directory: leftover/ (1 test)")
    assert lines[folder + 1] == "  tests/test_leaks.py::test_leaves_a_folder  left behind", result.stdout
    assert "test_clean" not in result.stdout and "test_deselected" not in result.stdout  # the arguments after --
    # pytest ran from the folder above the tree's topmost package, not from the caller's directory.
    assert (project / "leftover").is_dir() and not (elsewhere / "leftover").exists()
    # The command it runs, pytest's arguments included (progress lines only come every 30 s off a terminal).
    assert "census: " in result.stderr and "-k not deselected" in result.stderr, result.stderr


def test_bad_input_exits_2_with_a_message(tmp_path):
    result = run_census(str(tmp_path / "missing"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file or folder" in result.stderr

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "helpers.py").write_text("X = 1\n", encoding="utf-8")
    result = run_census(str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no test collected in" in result.stderr
