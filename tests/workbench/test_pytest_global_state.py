"""The global-state plugin (utils/pytest_global_state.py): a test that changes process-global state fails, and the
next test of the worker starts clean (every kind of the synthetic suite, global_state_leaks.py); a change after a
library's first import is the test's whichever test imports it first; TF32 settings are read through the running
torch's API, plugins' own signal handlers are not blamed on the test, and files left in the working directory are
named (and deleted when the test's own Python made them, not otherwise): under two xdist workers, against the test that
left them, never against the one running beside it. The message says of each line whether it was put back."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch


UTILS = Path(__file__).resolve().parents[2] / "utils"
LEAKS_SUITE = Path(__file__).with_name("global_state_leaks.py")

POISON = """
import logging
import os
import signal
import sys

import torch


def test_1_leaves_dtype_env_and_signal():
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.path.insert(0, "/nonexistent/leaked")
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger("transformers").addHandler(logging.NullHandler())
    logging.disable(logging.INFO)


def test_2_starts_clean():
    assert torch.get_default_dtype() == torch.float32
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert "/nonexistent/leaked" not in sys.path
    assert not any(type(h) is logging.NullHandler for h in logging.getLogger().handlers)  # pytest adds a subclass
    assert logging.getLogger("transformers").handlers == []
    assert logging.root.manager.disable == logging.NOTSET


def test_3_restores_what_it_changes(monkeypatch):
    monkeypatch.setenv("SOME_VARIABLE", "1")
    torch.set_num_threads(torch.get_num_threads())
"""

# As upstream's root conftest.py: after enable_tf32(False), torch >= 2.9's legacy cudnn.allow_tf32 getter raises.
TF32_CONFTEST = """
from transformers.utils import enable_tf32

enable_tf32(False)
"""

TF32_TESTS = """
import torch


def test_1_changes_matmul_precision():
    torch.backends.cuda.matmul.fp32_precision = "tf32"


def test_2_starts_clean():
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_3_restores_what_it_changes():
    torch.set_float32_matmul_precision("high")
    torch.set_float32_matmul_precision("highest")
"""

# What pytest-timeout does with SIGALRM: installed around each test, reset to SIG_DFL when a test fails.
FAKE_TIMEOUT_PLUGIN = """
import signal

import pytest


def _on_alarm(signum, frame):
    pytest.fail("timed out")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        return (yield)
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def pytest_exception_interact(node):
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
"""

FAILING_TESTS = """
import signal


def test_1_fails():
    assert False


def test_2_passes():
    pass


def test_3_leaves_a_handler():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
"""

FILE_TESTS = """
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOTDIR, OUTSIDE = Path(os.environ["TEST_ROOTDIR"]), Path(os.environ["TEST_OUTSIDE"])


def test_1_leaves_files():
    Path("leftover").mkdir()
    (Path("leftover") / "inner.txt").write_text("x")
    Path("out.txt").write_text("x")
    Path("part.tmp").write_text("x")
    os.replace("part.tmp", "saved.txt")  # an atomic save: the test's own file under a new name
    os.replace("existing_2.txt", "renamed.txt")  # what was there before, under a new name: not the test's
    os.symlink(OUTSIDE, "link")
    (ROOTDIR / "in_rootdir").mkdir()
    Path("existing.txt").write_text("changed")
    Path("again.txt").write_text("x")
    Path("again.txt").unlink()  # then made again by another process: not the test's file
    subprocess.run([sys.executable, "-c", "open('made_by_a_child.txt', 'w'); open('again.txt', 'w')"], check=True)
    with open("made_by_a_child.txt", "a") as child:  # O_CREAT, but the file was there: still the child's
        child.write("x")


def test_1_makes_files_in_the_usual_ways():
    open("x_mode.txt", "x").close()
    open("a_mode.txt", "a").close()
    Path("touched").touch()
    os.makedirs("made/dirs")
    shutil.copy("existing.txt", "copied.txt")  # a new file: the original stays
    Path("tree").mkdir()
    shutil.copytree("tree", "copied_tree")
    os.link("x_mode.txt", "hardlink.txt")
    tempfile.mkstemp(dir=".", prefix="mkstemp_")
    tempfile.mkdtemp(dir=".", prefix="mkdtemp_")


def test_2_starts_clean():
    expected = ["again.txt", "existing.txt", "made_by_a_child.txt", "renamed.txt", "test_files.py"]
    left = sorted(set(os.listdir()) - {"__pycache__"})  # pytest's, from importing this file before the first test
    assert left == expected and not os.listdir(ROOTDIR)
    assert Path("existing.txt").read_text() == "changed" and Path("renamed.txt").read_text() == "before"
    assert Path("made_by_a_child.txt").exists() and (OUTSIDE / "kept.txt").exists()


def test_3_cleans_up():
    Path("scratch.txt").write_text("x")
    Path("scratch.txt").unlink()
"""


# What is not the test's call's making, or was there before: never deleted (each of these lost data or broke a later
# test when the guard deleted it).
NOT_THE_TESTS = """
import os
import threading
from logging.handlers import RotatingFileHandler
import logging

import pytest

WRITTEN = threading.Event()


@pytest.fixture(scope="module")
def artifacts():
    os.makedirs("artifacts")  # a module-scoped fixture's folder, in use until the module ends
    yield "artifacts"
    os.rmdir("artifacts")


def test_1_renames_what_was_there(tmp_path_factory):
    os.makedirs("userdata", exist_ok=True)  # there before: opening it is not making it
    os.rename("userdata", "userdata.old")
    handler = RotatingFileHandler("app.log", maxBytes=10, backupCount=1)  # rolls the old app.log over to app.log.1
    logger = logging.getLogger("not_the_tests")
    logger.addHandler(handler)
    logger.warning("one line")
    logger.removeHandler(handler)
    handler.close()
    tmp_path_factory.mktemp("made_in_the_call")  # under pytest's basetemp, which is pytest's


def test_2_uses_a_module_fixture(artifacts, tmp_path):
    threading.Thread(target=lambda: (open("from_a_thread.txt", "w").close(), WRITTEN.set())).start()
    WRITTEN.wait(10)


def test_3_still_has_it(artifacts):
    assert os.path.isdir(artifacts)
"""


# Under `-n 2`, xdist hands out fewer than 4 tests round-robin: these two run on different workers, and meet at a file
# barrier (in SYNC, outside the working directory), so that both are running when the two folders appear.
XDIST_TESTS = """
import os
import subprocess
import sys
import time
from pathlib import Path

SYNC = Path(os.environ["GLOBAL_STATE_SYNC"])


def _wait_for(name):
    deadline = time.monotonic() + 30
    while not (SYNC / name).exists():
        assert time.monotonic() < deadline, f"the other worker never reached {name}"
        time.sleep(0.02)


def test_1_leaves_folders():
    _wait_for("2_running")
    Path("leftover").mkdir()
    subprocess.run([sys.executable, "-c", "import os; os.mkdir('made_by_a_child')"], check=True)
    (SYNC / "1_made").touch()


def test_2_runs_beside_it():
    (SYNC / "2_running").touch()
    _wait_for("1_made")
"""


# One test silences transformers' logger, another only imports transformers: whichever runs first imports it.
SILENCES = """
def test_silences_transformers():
    from transformers.utils import logging

    logging.set_verbosity_error()
"""
IMPORTS = """
def test_imports_transformers():
    import transformers  # noqa: F401
"""
LEVEL_PUT_BACK = """
def test_zz_level_put_back():
    import logging

    assert logging.getLogger("transformers").level != logging.ERROR
"""


def run_pytest(folder: Path, *args: str, **files: str) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text, encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUBLAS_WORKSPACE_CONFIG", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(UTILS), str(folder), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider", "-q", "-rA", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_test_that_changes_global_state_fails_and_the_next_starts_clean(tmp_path):
    out = run_pytest(tmp_path, test_poison__py=POISON).stdout
    assert "3 passed" in out and "1 error" in out, out
    assert "ERROR at teardown of test_1_leaves_dtype_env_and_signal" in out, out
    assert "torch default dtype: torch.float32 -> torch.float64 (put back)" in out
    assert "torch deterministic algorithms (enabled, warn_only): (False, False) -> (True, False)" in out
    assert "environment: CUBLAS_WORKSPACE_CONFIG: '<unset>' -> ':4096:8'" in out
    assert "signal handlers: SIGTERM: <Handlers.SIG_DFL: 0> -> <Handlers.SIG_IGN: 1>" in out
    assert "sys.path: added '/nonexistent/leaked'" in out
    assert "logging handlers: root: added <NullHandler (NOTSET)>" in out
    assert "logging handlers: transformers: added <NullHandler (NOTSET)>" in out
    assert "logging.disable level: 0 -> 20" in out


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["serial", "two-workers"])
def test_each_leak_is_charged_to_its_test_and_no_clean_test_is_blamed(tmp_path, workers):
    """The synthetic suite (global_state_leaks.py): an error for each `test_leaks_*` test and for nothing else; a
    thread ending during a later test and modules first imported do not count. Under `-n 2` the file runs on one
    worker (`--dist loadfile`), so that the thread still ends during a later test of the same worker."""
    if workers and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (the suite's first import of it)")
    source = LEAKS_SUITE.read_text(encoding="utf-8")
    out = run_pytest(tmp_path, *workers, test_leaks__py=source).stdout
    tests = re.findall(r"^def (test_\w+)", source, re.MULTILINE)
    errors = set(re.findall(r"^ERROR test_leaks\.py::(\w+)", out, re.MULTILINE))
    assert errors == {test for test in tests if test.startswith("test_leaks_")}, out
    assert f"{len(tests)} passed, 1 warning, {len(errors)} errors" in out, out
    thread = "non-daemon threads: started, still running: 'short-lived' (not stopped: a thread cannot be stopped from"
    assert thread in out, out
    interop = r"torch inter-op threads: \d+ -> \d+ \(not put back: torch allows setting it once per process\)"
    assert re.search(interop, out), out
    assert "logging handlers: root: added <StreamHandler" in out, out
    assert "test_noted_start_method_fixed_to_the_default: multiprocessing start method fixed to the platform" in out


@pytest.mark.parametrize("first", ["silences", "imports"])
def test_a_change_made_after_a_first_import_is_the_tests_whichever_test_imports_first(tmp_path, first):
    """The logger a library configures on its first import is compared with its state right after that import: the
    test that silences transformers is blamed whether or not it is the one that imports it first (as under `-n 2`, where
    each worker's first import falls on another test), and the level is put back for the next test."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    tests = [SILENCES, IMPORTS] if first == "silences" else [IMPORTS, SILENCES]
    out = run_pytest(tmp_path, test_first_import__py="".join(tests) + LEVEL_PUT_BACK).stdout
    assert "3 passed, 1 error" in out, out
    assert "ERROR at teardown of test_silences_transformers" in out, out
    assert "log levels: transformers: 30 -> 40" in out, out


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 has no fp32_precision API")
def test_tf32_is_read_through_the_fp32_precision_api_after_enable_tf32(tmp_path):
    out = run_pytest(tmp_path, conftest__py=TF32_CONFTEST, test_tf32__py=TF32_TESTS).stdout
    assert "3 passed" in out and "1 error" in out, out
    assert "ERROR at teardown of test_1_changes_matmul_precision" in out, out
    assert "torch.backends.cuda.matmul.fp32_precision: 'ieee' -> 'tf32'" in out, out
    # The matmul precision getter raises now (cuda and mkldnn disagree): reported, not a crash.
    assert "torch float32 matmul precision: 'highest' -> <getter raised RuntimeError" in out, out


@pytest.mark.parametrize("plugin", ["imitation", "pytest-timeout"])
def test_a_plugins_own_signal_handler_is_not_the_tests_leak(tmp_path, plugin):
    if plugin == "pytest-timeout":
        if importlib.util.find_spec("pytest_timeout") is None:
            pytest.skip("pytest-timeout is not installed")
        args, files = ["--timeout", "60"], {}
    else:
        args, files = ["-p", "fake_timeout"], {"fake_timeout__py": FAKE_TIMEOUT_PLUGIN}
    out = run_pytest(tmp_path, *args, test_failing__py=FAILING_TESTS, **files).stdout
    assert "1 failed, 2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_3_leaves_a_handler" in out, out
    assert "signal handlers: SIGUSR1: <Handlers.SIG_DFL: 0> -> <Handlers.SIG_IGN: 1>" in out, out
    assert "SIGALRM" not in out, out


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["serial", "two-workers"])
def test_files_the_tests_python_left_are_deleted_and_the_others_named(tmp_path, monkeypatch, workers):
    """What the test's own Python made in the working directory or the rootdir is deleted at its teardown (a symbolic
    link, not its target); what was there before (modified, or renamed) and what a subprocess made stay, named. Under
    `-n 2` the file runs on one worker (`--dist loadfile`), and the subprocess's file is the controller's to name."""
    if workers and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    root, run, outside = tmp_path / "root", tmp_path / "run", tmp_path / "outside"
    for folder in (root, run, outside):
        folder.mkdir()
    (outside / "kept.txt").write_text("x")
    (run / "existing.txt").write_text("before")
    (run / "existing_2.txt").write_text("before")
    monkeypatch.setenv("TEST_ROOTDIR", str(root))
    monkeypatch.setenv("TEST_OUTSIDE", str(outside))
    out = run_pytest(run, "--rootdir", str(root), *workers, test_files__py=FILE_TESTS).stdout
    assert "4 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_1_leaves_files" in out, out
    assert "left process-global state changed (each line says whether it was put back for the next test):" in out
    deleted = re.findall(r"files in the working directory: (\S+): left behind \(deleted\)", out)
    assert {re.sub(r"(mk[sd]temp_)[^/]*", r"\1", name) for name in deleted} == {
        *("leftover/", "out.txt", "saved.txt", "link/"),  # test_1_leaves_files
        *("x_mode.txt", "a_mode.txt", "touched", "made/", "copied.txt", "tree/", "copied_tree/", "hardlink.txt"),
        *("mkstemp_", "mkdtemp_/"),
    }, out
    assert "files in the rootdir: in_rootdir/: left behind (deleted)" in out, out
    # Under -n 2, not made by this worker's Python: the controller names them at the end of the session.
    not_made = "left behind by test_files.py::test_1" if workers else "left behind (not deleted: not seen made by this"
    for name in ("again.txt", "renamed.txt", "made_by_a_child.txt"):
        assert f"files in the working directory: {name}: {not_made}" in out, out
    assert "scratch.txt" not in out and "existing.txt" not in out, out
    expected = ["again.txt", "existing.txt", "made_by_a_child.txt", "renamed.txt", "test_files.py"]
    assert sorted(set(os.listdir(run)) - {"__pycache__"}) == expected, out
    assert (run / "existing.txt").read_text() == "changed" and (outside / "kept.txt").exists()


def test_what_the_tests_call_did_not_make_is_never_deleted(tmp_path):
    """A folder or file there before the test (opened, renamed, rolled over), a module fixture's folder, a thread's file
    and pytest's --basetemp: named where new, never deleted (a wider fixture's folder deleted broke the next test)."""
    (tmp_path / "userdata").mkdir()
    (tmp_path / "userdata" / "notes.txt").write_text("mine")
    (tmp_path / "app.log").write_text("the user's log\n" * 5)
    out = run_pytest(tmp_path, "--basetemp", "bt", test_not_the_tests__py=NOT_THE_TESTS).stdout
    assert "3 passed, 2 errors" in out, out
    for name in ("userdata.old/", "app.log.1", "artifacts/", "from_a_thread.txt"):
        assert f"files in the working directory: {name}: left behind (not deleted" in out, out
    assert "bt" not in re.findall(r"files in the working directory: (\S+):", out), out
    assert (tmp_path / "userdata.old" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "app.log.1").read_text().startswith("the user's log")
    assert (tmp_path / "bt").is_dir() and not (tmp_path / "artifacts").exists()


def test_variables_torch_sets_once_per_process_are_not_a_tests_leak(monkeypatch):
    monkeypatch.syspath_prepend(str(UTILS))
    import pytest_global_state

    before = pytest_global_state.snapshot()
    monkeypatch.setenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "140000000000000")  # what torch.compile sets
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_cache")
    assert pytest_global_state.changes(before, pytest_global_state.snapshot()) == []
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "1")
    assert pytest_global_state.changes(before, pytest_global_state.snapshot()) == [
        ("environment: SOME_OTHER_VARIABLE", "'<unset>' -> '1'")
    ]


def test_a_path_entry_a_package_adds_on_its_first_import_is_not_a_tests_leak(tmp_path, monkeypatch):
    # As setuptools adds its `_vendor` folder on its first import (upstream's torch.compile test reaches it)
    monkeypatch.syspath_prepend(str(UTILS))
    import pytest_global_state

    package = tmp_path / "vendoring_package"
    (package / "_vendor").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import os, sys\nsys.path.append(os.path.join(os.path.dirname(__file__), '_vendor'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vendoring_package", raising=False)
    before = pytest_global_state.snapshot()
    importlib.import_module("vendoring_package")
    assert pytest_global_state.changes(before, pytest_global_state.snapshot()) == []
    sys.path.append(str(tmp_path / "elsewhere"))  # an entry of the test's own is still its change
    assert pytest_global_state.changes(before, pytest_global_state.snapshot()) == [
        ("sys.path", f"added {str(tmp_path / 'elsewhere')!r}")
    ]
    sys.path.remove(str(tmp_path / "elsewhere"))
    sys.path.remove(str(package / "_vendor"))
    del sys.modules["vendoring_package"]


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
def test_under_two_workers_a_folder_is_charged_to_the_test_that_left_it_not_to_the_one_beside_it(
    tmp_path, monkeypatch
):
    run, sync = tmp_path / "run", tmp_path / "sync"
    run.mkdir()
    sync.mkdir()
    monkeypatch.setenv("GLOBAL_STATE_SYNC", str(sync))
    result = run_pytest(run, "-n", "2", test_xdist__py=XDIST_TESTS)
    out = result.stdout
    # The workers really overlapped.
    assert {"1_made", "2_running"} <= {p.name for p in sync.iterdir()}, out
    assert "2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_1_leaves_folders" in out, out
    assert "files in the working directory: leftover/: left behind (deleted)" in out, out
    assert not (run / "leftover").exists() and (run / "made_by_a_child").exists(), out  # the child's is only named
    assert "ERROR at teardown of test_2" not in out and "PASSED test_xdist.py::test_2_runs_beside_it" in out, out
    # Made by a subprocess, it is nobody's Python: reported once, for the session, with both tests that saw it appear.
    assert "files left behind, attributed at the end of the session" in out, out
    assert (
        "files in the working directory: made_by_a_child/: left behind while these ran on different workers: "
        "test_xdist.py::test_1_leaves_folders, test_xdist.py::test_2_runs_beside_it"
    ) in out, out
    assert result.returncode == 1, out
