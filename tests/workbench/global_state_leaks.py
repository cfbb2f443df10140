"""A synthetic suite for the global-state guard (utils/pytest_global_state.py), copied as a test module by
test_pytest_global_state.py: one `test_leaks_*` test per kind of state the guard checks, each leaving exactly that
changed; `test_clean_*` tests that leave nothing (a thread another test started ends during `test_clean_after`;
modules are first imported in `test_clean_imports_a_backend` and `test_clean_first_imports_transformers`), and `test_not_checked_*` tests that change state the guard
deliberately leaves alone (the global RNGs and warnings filters: see the README's Census section). A tool that blames a
`test_clean_*` test raises a false alarm. Deterministic: the thread waits on an event, no sleeps."""

import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch


RELEASE = threading.Event()
STARTED = []


def test_leaks_a_thread():
    thread = threading.Thread(target=RELEASE.wait, name="short-lived")
    thread.start()
    STARTED.append(thread)


def test_clean_after():
    RELEASE.set()  # the thread the test before started ends during this test
    STARTED[0].join()


def test_clean_imports_a_backend():
    import torch.backends.xnnpack  # noqa: F401


def test_clean_first_imports_transformers():
    assert "transformers" not in sys.modules, "this suite must run in a process that has not imported transformers"
    # Its first import configures its logger (level, handler): transformers' initialisation, not a leak of the test.
    pytest.importorskip("transformers")


def test_clean_restores_what_it_changes(monkeypatch):
    monkeypatch.setenv("SOME_VARIABLE", "1")
    monkeypatch.syspath_prepend("/nonexistent/restored")
    handler = logging.NullHandler()
    logging.getLogger().addHandler(handler)
    logging.getLogger().removeHandler(handler)
    torch.set_num_threads(torch.get_num_threads())


def test_leaks_default_dtype():
    torch.set_default_dtype(torch.float64)


def test_leaks_deterministic_algorithms():
    torch.use_deterministic_algorithms(True)


def test_leaks_cudnn_benchmark():
    torch.backends.cudnn.benchmark = True


def test_leaks_cudnn_deterministic():
    torch.backends.cudnn.deterministic = True


def test_leaks_cudnn_enabled():
    torch.backends.cudnn.enabled = False


def test_leaks_matmul_precision():
    torch.set_float32_matmul_precision("high")


def test_leaks_tf32():
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True


def test_leaks_grad_mode():
    torch.set_grad_enabled(False)


def test_leaks_anomaly_detection():
    torch.set_anomaly_enabled(True)


def test_leaks_intra_op_threads():
    torch.set_num_threads(torch.get_num_threads() + 1)


def test_leaks_inter_op_threads():
    torch.set_num_interop_threads(torch.get_num_interop_threads() + 1)  # once per process, before any inter-op work


def test_leaks_environment():
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def test_leaks_signal_handler():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_leaks_start_method():
    multiprocessing.set_start_method("spawn", force=True)


def test_leaks_working_directory(tmp_path):
    os.chdir(tmp_path)


def test_leaks_a_file():
    Path("leftover.txt").write_text("x", encoding="utf-8")


def test_leaks_log_level():
    logging.getLogger("transformers").setLevel(logging.ERROR)


def test_leaks_root_handler():
    logging.getLogger().addHandler(logging.StreamHandler())


def test_leaks_transformers_handler():
    logging.getLogger("transformers").addHandler(logging.NullHandler())


def test_leaks_logging_disable():
    logging.disable(logging.INFO)


def test_leaks_sys_path():
    sys.path.insert(0, "/nonexistent/leaked")


def test_clean_puts_a_path_entry_in_front_again():
    sys.path.insert(0, sys.path[0])  # the first entry again: a later import finds what it found before


def test_not_checked_random_state():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)


def test_not_checked_warnings_filter():
    warnings.simplefilter("ignore")


def test_clean_last():
    pass
