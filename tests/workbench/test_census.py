"""utils/census.py on synthetic test trees: runs them under the global-state guard from the tree's root and prints,
grouped by what changed, the tests that changed it; the same leaks, counted once, serially and under two xdist workers;
the same again when rerun on the same tree; exit 2 on bad input."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


CENSUS = Path(__file__).resolve().parents[2] / "utils" / "census.py"

TESTS = """
import os
import subprocess
import sys
from pathlib import Path


def test_leaves_a_variable():
    os.environ["CENSUS_LEAK"] = "1"


def test_leaves_a_folder():
    Path("leftover").mkdir()
    subprocess.run([sys.executable, "-c", "import os; os.mkdir('made_by_a_child')"], check=True)


def test_also_leaves_the_variable():
    os.environ["CENSUS_LEAK"] = "2"


def test_clean():
    pass


def test_deselected():
    os.environ["CENSUS_DESELECTED"] = "1"
"""


# Under `-n 2`, xdist hands out fewer than 4 tests round-robin: the first two run on different workers and meet at a file
# barrier (in CENSUS_SYNC, outside the tree), so that both are running when the folder appears; serially there is none.
XDIST_TESTS = """
import os
import time
from pathlib import Path

XDIST = "PYTEST_XDIST_WORKER" in os.environ


def _mark(name):
    if XDIST:
        (Path(os.environ["CENSUS_SYNC"]) / name).touch()


def _wait_for(name):
    deadline = time.monotonic() + 30
    while XDIST and not (Path(os.environ["CENSUS_SYNC"]) / name).exists():
        assert time.monotonic() < deadline, f"the other worker never reached {name}"
        time.sleep(0.02)


def test_1_leaves_a_folder():
    _wait_for("2_running")
    Path("leftover").mkdir()
    _mark("1_made")


def test_2_runs_beside_it():
    _mark("2_running")
    _wait_for("1_made")


def test_3_leaves_a_variable():
    os.environ["CENSUS_LEAK"] = "1"
"""


def run_census(*args: str, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    # As from a shell: not the variables of this pytest run (under -n, its worker's PYTEST_XDIST_WORKER).
    ours = ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "CENSUS_LEAK")
    env = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith("PYTEST_XDIST")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
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
    assert "4 of 4 tests run, 4 leaks by 3 tests, 0 left entries not attributed" in lines[0], result.stdout
    group = lines.index("environment: CENSUS_LEAK (2 tests)")
    assert lines[group + 1].startswith("  tests/test_leaks.py::test_also_leaves_the_variable  '<unset>' -> '2'")
    assert lines[group + 2].startswith("  tests/test_leaks.py::test_leaves_a_variable  '<unset>' -> '1'")
    for name in ("leftover", "made_by_a_child"):
        folder = lines.index(f"files in the working directory: {name}/ (1 test)")
        assert lines[folder + 1] == "  tests/test_leaks.py::test_leaves_a_folder  left behind", result.stdout
    assert "test_clean" not in result.stdout and "test_deselected" not in result.stdout  # the arguments after --
    # pytest ran from the folder above the tree's topmost package, not from the caller's directory; what the tests
    # left there, the guard deleted at the test's teardown (made by its Python) or the census removed (by a subprocess).
    assert f"census: removed {project / 'made_by_a_child'} (left by the tests)" in result.stderr, result.stderr
    assert f"census: removed {project / 'leftover'}" not in result.stderr, result.stderr
    assert not (project / "leftover").exists() and not (elsewhere / "leftover").exists()
    assert not (project / "made_by_a_child").exists() and not (elsewhere / "made_by_a_child").exists()
    # The command it runs, pytest's arguments included (progress lines only come every 30 s off a terminal).
    assert "census: " in result.stderr and "-k not deselected" in result.stderr, result.stderr


def test_a_relative_pythonpath_means_the_callers_folder(tmp_path):
    # As in `PYTHONPATH=build/stock/src .venv/bin/python utils/census.py ...`: pytest runs from the tree's root
    (tmp_path / "stock").mkdir()
    (tmp_path / "stock" / "census_probe.py").write_text("WHERE = 'stock'\n", encoding="utf-8")
    (tmp_path / "tree").mkdir()
    test = "import census_probe\n\n\ndef test_stock():\n    assert census_probe.WHERE == 'stock'\n"
    (tmp_path / "tree" / "test_probe.py").write_text(test, encoding="utf-8")

    result = run_census("tree", cwd=tmp_path, pythonpath="stock")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "pytest: 1 passed" in result.stdout, result.stdout


def test_bad_input_exits_2_with_a_message(tmp_path):
    result = run_census(str(tmp_path / "missing"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no such file or folder" in result.stderr

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "helpers.py").write_text("X = 1\n", encoding="utf-8")
    result = run_census(str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no test collected in" in result.stderr


def xdist_tree(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "test_leaks.py").write_text(XDIST_TESTS, encoding="utf-8")
    monkeypatch.setenv("CENSUS_SYNC", str(tmp_path))
    return tmp_path / "tree"


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
def test_serially_and_under_two_workers_the_census_names_the_same_leaks_once(tmp_path, monkeypatch):
    tree = xdist_tree(tmp_path, monkeypatch)
    serial = run_census(str(tree), cwd=tmp_path)
    assert not (tmp_path / "2_running").exists()
    parallel = run_census(str(tree), "-n", "2", cwd=tmp_path)

    assert {"1_made", "2_running"} <= {p.name for p in tmp_path.iterdir()}, parallel.stdout  # the workers overlapped
    assert "3 of 3 tests run, 2 leaks by 2 tests, 0 left entries not attributed" in serial.stdout, serial.stdout
    expected = [
        "environment: CENSUS_LEAK (1 test)",
        "  test_leaks.py::test_3_leaves_a_variable  '<unset>' -> '1'",
        "files in the working directory: leftover/ (1 test)",
        "  test_leaks.py::test_1_leaves_a_folder  left behind",
    ]
    for result in (serial, parallel):
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == serial.stdout.splitlines()[0], result.stdout  # the same counts
        assert lines[1].startswith("pytest: 3 passed, 2 errors in"), result.stdout  # tests 1 and 3 fail at teardown
        assert lines[3:] == expected, result.stdout


def test_a_rerun_on_the_same_tree_finds_the_same_leaks(tmp_path, monkeypatch):
    tree = xdist_tree(tmp_path, monkeypatch)
    first = run_census(str(tree), cwd=tmp_path)
    second = run_census(str(tree), cwd=tmp_path)

    assert "files in the working directory: leftover/ (1 test)" in first.stdout, first.stdout
    assert first.stdout.splitlines()[3:] == second.stdout.splitlines()[3:], second.stdout
    assert first.stdout.splitlines()[0] == second.stdout.splitlines()[0], second.stdout
    assert not (tree / "leftover").exists()
