"""A synthetic suite for the global-state guard (utils/pytest_global_state.py), copied as a test module by
test_pytest_global_state.py: one `test_leaks_*` test per kind of state the guard checks, each leaving exactly that
changed; `test_clean_*` tests that leave nothing (a thread another test started ends during `test_clean_after`;
modules are first imported in `test_clean_imports_a_backend` and `test_clean_first_imports_transformers`, and
`test_leaks_verbosity` silences transformers after that import), `test_not_checked_*` tests that change state the guard
deliberately leaves alone (the global RNGs, warnings filters, an `atexit` handler, a daemon thread: see the README's
Census section), and a last test that checks that every setting a `test_leaks_*` test changed was put back. A tool that
blames a `test_clean_*` test raises a false alarm. Deterministic: the thread waits on an event, no sleeps."""

import atexit
import colorsys
import ctypes
import faulthandler
import gc
import locale
import logging
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch


RELEASE = threading.Event()
STARTED = []
LIBC = ctypes.CDLL(None)
LIBC.getenv.restype = ctypes.c_char_p
# The settings every test starts from, read when the module is collected: the last test checks they were put back.
UMASK = os.umask(0o022)
os.umask(UMASK)
START = {
    "start method": multiprocessing.get_start_method(allow_none=True),
    "umask": UMASK,
    "locale": locale.setlocale(locale.LC_ALL),
    "faulthandler": faulthandler.is_enabled(),
    "recursion limit": sys.getrecursionlimit(),
    "numpy errors": np.geterr(),
    "print options": dict(vars(torch._tensor_str.PRINT_OPTS)),
    "colorsys.rgb_to_hsv": colorsys.rgb_to_hsv,
}


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


def test_noted_start_method_fixed_to_the_default():
    # Without allow_none: fixes the platform's default, and set_start_method without force raises. A library's first use
    # of the default context does it too (tqdm's first progress bar): put back and warned about, not an error.
    multiprocessing.get_start_method()


def test_leaks_putenv():
    os.putenv("GUARD_PUTENV_LEAK", "1")  # not in os.environ, but in every subprocess's environment


def test_leaks_module_attribute():
    colorsys.rgb_to_hsv = lambda r, g, b: (0.0, 0.0, 0.0)


def test_leaks_sys_modules_entry():
    sys.modules["colorsys"] = types.ModuleType("colorsys")


def test_leaks_socket_timeout():
    socket.setdefaulttimeout(5)


def test_leaks_umask():
    os.umask(0o077 if UMASK != 0o077 else 0o022)


def test_leaks_locale():
    locale.setlocale(locale.LC_CTYPE, "C" if locale.setlocale(locale.LC_CTYPE) != "C" else "C.UTF-8")


def test_leaks_faulthandler():
    faulthandler.disable() if faulthandler.is_enabled() else faulthandler.enable()


def test_leaks_gc_disabled():
    gc.disable()


def test_leaks_recursion_limit():
    sys.setrecursionlimit(sys.getrecursionlimit() + 100)


def test_leaks_numpy_errors():
    np.seterr(divide="raise")


def test_leaks_torch_print_options():
    torch.set_printoptions(precision=2)


def test_leaks_working_directory(tmp_path):
    os.chdir(tmp_path)


def test_leaks_a_file():
    Path("leftover.txt").write_text("x", encoding="utf-8")


def test_leaks_log_level():
    logging.getLogger("transformers").setLevel(logging.ERROR)


def test_leaks_verbosity():
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()


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


def test_not_checked_atexit_handler():
    atexit.register(print)  # cannot be listed, so cannot be put back (README, Census)


def test_not_checked_daemon_thread():
    threading.Thread(target=RELEASE.wait, daemon=True).start()  # RELEASE is set: it ends at once


def test_clean_last_starts_with_everything_put_back():
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert not torch.are_deterministic_algorithms_enabled() and not torch.is_anomaly_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and LIBC.getenv(b"GUARD_PUTENV_LEAK") is None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and socket.getdefaulttimeout() is None
    assert multiprocessing.get_start_method(allow_none=True) == START["start method"]
    assert sys.modules["colorsys"] is colorsys and colorsys.rgb_to_hsv is START["colorsys.rgb_to_hsv"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert umask == START["umask"] and locale.setlocale(locale.LC_ALL) == START["locale"]
    assert faulthandler.is_enabled() == START["faulthandler"] and gc.isenabled()
    assert sys.getrecursionlimit() == START["recursion limit"] and np.geterr() == START["numpy errors"]
    assert dict(vars(torch._tensor_str.PRINT_OPTS)) == START["print options"]
    assert logging.getLogger("transformers").level == logging.WARNING and logging.root.manager.disable == 0
    assert "/nonexistent/leaked" not in sys.path
    assert not Path("leftover.txt").exists()  # made by the test's Python: deleted
