"""pytest plugin: a test that leaves process-global state changed fails, naming what it changed.

``make test`` loads it for the project's tests (``-p pytest_global_state`` with ``utils/`` on the path). Before each
test's set-up it takes a snapshot of the state that another test of the same pytest worker would inherit: torch's
default dtype, deterministic-algorithm flags, cuDNN/TF32/matmul-precision flags, grad and anomaly modes, thread counts,
the environment (``CUBLAS_WORKSPACE_CONFIG`` included), the signal handlers, the multiprocessing start method, the
working directory, the log levels, the ``torch.backends`` modules and the non-daemon threads alive. After the test's
tear-down it takes another; any difference is an error of that test's tear-down, and the state is put back so that the
next test starts clean. The snapshot reads only and imports nothing: torch's settings are compared when torch was
imported before the test's set-up (test modules import it when they are collected).
"""

import logging
import multiprocessing
import os
import signal
import sys
import threading

import pytest


SIGNALS = [
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM")
]
# pytest's own variable, and one that torch sets once, the first time it needs it, whoever asks first.
IGNORED_ENVIRONMENT = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}
_SNAPSHOTS = {}


def _flags():
    """(name, getter, setter) for each torch setting of the snapshot; none when torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled
    return [
        ("torch default dtype", torch.get_default_dtype, torch.set_default_dtype),
        (
            "torch deterministic algorithms (enabled, warn_only)",
            lambda: (torch.are_deterministic_algorithms_enabled(), warn_only()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        ),
        ("torch.backends.cudnn.enabled", lambda: cudnn.enabled, lambda v: setattr(cudnn, "enabled", v)),
        ("torch.backends.cudnn.benchmark", lambda: cudnn.benchmark, lambda v: setattr(cudnn, "benchmark", v)),
        (
            "torch.backends.cudnn.deterministic",
            lambda: cudnn.deterministic,
            lambda v: setattr(cudnn, "deterministic", v),
        ),
        ("torch.backends.cudnn.allow_tf32", lambda: cudnn.allow_tf32, lambda v: setattr(cudnn, "allow_tf32", v)),
        (
            "torch.backends.cuda.matmul.allow_tf32",
            lambda: matmul.allow_tf32,
            lambda v: setattr(matmul, "allow_tf32", v),
        ),
        ("torch float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        ("torch grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("torch anomaly detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("torch intra-op threads", torch.get_num_threads, torch.set_num_threads),
    ]


def snapshot() -> dict:
    state = {name: get() for name, get, _ in _flags()}
    if "torch" in sys.modules:
        state["torch inter-op threads"] = sys.modules["torch"].get_num_interop_threads()
    state["environment"] = {k: v for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT}
    state["signal handlers"] = {signal.Signals(s).name: signal.getsignal(s) for s in SIGNALS}
    state["multiprocessing start method"] = multiprocessing.get_start_method(allow_none=True)
    state["working directory"] = os.getcwd()
    loggers = ["", "transformers", "accelerate", "torch"]
    state["log levels"] = {name or "root": logging.getLogger(name).level for name in loggers}
    state["torch.backends modules"] = sorted(m for m in sys.modules if m.startswith("torch.backends"))
    # Daemon threads (tqdm's monitor, ...) do not keep the process alive; the others do.
    state["non-daemon threads"] = sorted(t.name for t in threading.enumerate() if not t.daemon)
    return state


def differences(before: dict, after: dict) -> list[str]:
    problems = []
    for key in before:
        old, new = before[key], after.get(key)
        if old == new:
            continue
        if key == "multiprocessing start method" and old is None and new == multiprocessing.get_all_start_methods()[0]:
            continue  # asking for the start method fixes it to the platform's default: nothing changed
        if isinstance(old, dict):
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))
            shown = ", ".join(f"{k}: {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}" for k in changed)
            problems.append(f"{key}: {shown}")
        else:
            problems.append(f"{key}: {old!r} -> {new!r}")
    return problems


def restore(before: dict) -> None:
    """Puts back what can be put back (not threads, modules or the inter-op thread count)."""
    for name, _, set_value in _flags():
        if name not in before:
            continue
        try:
            set_value(before[name])
        except RuntimeError:
            pass
    for name in set(os.environ) - set(before["environment"]) - IGNORED_ENVIRONMENT:
        del os.environ[name]
    os.environ.update(before["environment"])
    for name, handler in before["signal handlers"].items():
        if handler is not None:
            signal.signal(signal.Signals[name], handler)
    os.chdir(before["working directory"])
    for name, level in before["log levels"].items():
        logging.getLogger("" if name == "root" else name).setLevel(level)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _SNAPSHOTS[item.nodeid] = snapshot()
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    before = _SNAPSHOTS.pop(item.nodeid, None)
    if before is None:
        return
    problems = differences(before, snapshot())
    if problems:
        restore(before)
        raise AssertionError(
            f"{item.nodeid} left process-global state changed (put back for the next test):\n  "
            + "\n  ".join(problems)
        )
