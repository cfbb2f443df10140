"""pytest plugin: a test that leaves process-global state changed fails, naming what it changed.

``make test`` loads it for the project's tests (``-p pytest_global_state`` with ``utils/`` on the path), and
``utils/census.py`` for any test tree. Before each test's set-up it takes a snapshot of the state that another test of
the same pytest worker would inherit: torch's default dtype, deterministic-algorithm flags, cuDNN flags, TF32 and
matmul precision (through the API the running torch uses: the ``fp32_precision`` settings where torch has them, the
legacy ``allow_tf32`` flags otherwise), grad and anomaly modes, thread counts and print options; the environment
(``CUBLAS_WORKSPACE_CONFIG`` included) and the process's environment block where it differs from ``os.environ``
(``os.putenv``), the signal handlers, the multiprocessing start method (fixed from unset to the platform's default:
put back with a warning, not an error, since tqdm's first progress bar does it once per process), the working
directory, the files and folders at the top of the working directory (and of pytest's rootdir where it differs),
``sys.path``, the entries of ``sys.modules``, the levels and handlers of the root, ``transformers``, ``accelerate`` and ``torch``
loggers, ``logging.disable``'s level, the socket default timeout, the umask, the locale, whether faulthandler and the
garbage collector are enabled, the collector's thresholds, the recursion limit, numpy's floating-point error handling,
and the non-daemon threads alive. After the test's tear-down it takes another, and compares every module's functions,
classes and submodules with a copy kept from the end of the previous test (a module's attribute replaced or deleted
without undo). Any difference is an error of that test's tear-down, and the state is put back so that the next test
starts clean; the error's message says of each line whether it was. What cannot be put back stays, with the reason on
its line: a file or folder left behind is deleted only if this process's Python made it during the test (below), and
named otherwise; a non-daemon thread keeps running (a thread cannot be stopped from outside); torch's inter-op thread
count stays (torch allows setting it once per process); so does a setting whose getter raised before the test or whose
setter raises.

Only what the test did counts. A non-daemon thread is the test's when it was not alive before the set-up and still is
after the tear-down: one that ends during a test (another test's, or a library's) is nobody's change. A library's
logger that the library configures when it is first imported (``transformers`` sets its level and adds its handler)
is compared, in the test that first imports it, with its state right after that import (a meta path finder notes it
when the library's ``__init__`` has run), so a change made after the import is the test's whichever test imports
first; a module's first import changes nothing else the snapshot holds (``import torch.backends.xnnpack`` is not a
change; a module imported for the first time is copied, not compared). A module attribute counts only when it held a
function, class, module or other callable and now holds something under another name (torch rewraps some functions
lazily under their own name; counters and caches are a library's own state); pytest's, its plugins', conftest files',
test modules' and ``warnings``' namespaces (pytest's warnings plugin swaps its functions around every test) are not
compared. The handlers pytest's log capture adds to the root logger around each phase are pytest's.

Not checked, deliberately (the README's Census section has the measurements): the global random generators
(``random``, numpy's, torch's), which a third of upstream's ``tests/trainer`` tests advance or seed, none wrongly (the
test that suffers reads one unseeded, and a comparison cannot name it); ``warnings.filters``, which pytest's warnings
plugin puts back after every test itself; daemon threads (tqdm's monitor), which do not keep the process alive and
cannot be stopped; ``atexit`` handlers, which Python gives no way to list, so none to put back.

A setting whose getter raises is recorded as such (and reported if that changes), never a crash of the snapshot. A
signal handler that a pytest plugin installs or resets itself (pytest-timeout's ``SIGALRM``, which it resets when a test
fails) is not the test's doing. The snapshot reads only and imports nothing: torch's settings are compared when torch
was imported before the test's set-up (test modules import it when they are collected). Files are compared by name: one
that was there before the test is never touched, and not seen being left again. A new one is deleted at the test's
tear-down (a folder with all it holds; a symbolic link itself, never what it points to) only when an audit hook
(``sys.addaudithook``: installed once per process, it notes names during a test, nothing else) saw this process's Python
create it during the test's call (in its main thread, not there an instant before): ``open`` with ``O_CREAT`` (modes ``w``, ``x``, ``a``; ``Path.write_text`` and
``touch``, ``shutil.copy*``, ``tempfile``'s files), ``os.mkdir`` (``os.makedirs``, ``Path.mkdir``, ``shutil.copytree``,
``tempfile.mkdtemp``), ``os.symlink``, ``os.link``, and ``os.rename``/``os.replace`` of a path the test created (not of
what was there before: its content is not the test's). The hook does not see code in C or another language write a file
(``torch.save``'s C++ writer, ``safetensors``, ``sqlite3``, ``os.mkfifo``), nor subprocesses or other programs (a user
saving a file while the tests run), and a fixture's set-up (a module- or session-scoped fixture's files are still in
use) or a thread (another test's may still be writing) is not the test's call: what they make is named, never deleted
(the census removes what its tests left, see ``utils/census.py``). Pytest's own ``--basetemp``, when it lies in a
watched folder, is not compared. A name the test's Python made and then removed (``os.remove``, ``os.rmdir``, a rename) is
forgotten: made again by another program, it is not deleted.

Under ``pytest -n N`` (N > 1) the workers are separate processes, so everything above stays per test, except the files:
the workers share the working directory, and a file one worker's test makes appears in the snapshots of whatever test
another worker is running at that moment. So a worker charges a new file or folder to its test, and deletes it, only
when its own process made it during the test (the audit hook above). Any other new entry (made by another worker, by a
subprocess, or by C code such as ``torch.save``'s writer) goes to the controller with the teardown report
(``user_properties``), and at the end of the session the controller takes the entries no test was charged with and that
are still there: seen by one test only, that test left it (the test that makes an entry sees it appear; another test
sees it too only if it was running at that instant); seen by several, it names them all as candidates. Either way it is
reported once, in the summary, and the session fails, but no test does; it is not deleted, since no process is known to
have made it.

``--global-state-log FILE`` appends one JSON line per test (``{"test": node id, "changed": [[what, change], ...]}``),
one per worker after collection (``{"collected": N, "folders": {label: path}}``) and, from the controller, one per
entry it reports (``{"left": what, "tests": [node id, ...]}``): what the census reads.
"""

import ctypes
import faulthandler
import gc
import itertools
import json
import locale
import logging
import multiprocessing
import operator
import os
import shutil
import signal
import socket
import sys
import threading
import warnings
from types import ModuleType

import pytest


SIGNALS = [
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM")
]
# pytest's own variable, and those torch's inductor sets once per process, the first time it needs them, whoever asks
# first (its cache folder; the address its compiled modules read, set when it loads the first one).
IGNORED_ENVIRONMENT = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"}
# torch >= 2.9: TF32 per backend and per operator. Once one is set, torch's legacy ``allow_tf32`` getters may raise.
FP32_PRECISION = [
    "fp32_precision",
    "cuda.matmul.fp32_precision",
    "cudnn.fp32_precision",
    "cudnn.conv.fp32_precision",
    "cudnn.rnn.fp32_precision",
    "mkldnn.fp32_precision",
    "mkldnn.matmul.fp32_precision",
    "mkldnn.conv.fp32_precision",
    "mkldnn.rnn.fp32_precision",
]
LEGACY_TF32 = ["cudnn.allow_tf32", "cuda.matmul.allow_tf32"]
# The audit events by which Python code creates a directory entry, and the argument holding its path; those by which
# it removes the entry its first argument names (a rename removes its source).
CREATING = {"open": 0, "os.mkdir": 0, "os.rename": 1, "os.symlink": 1, "os.link": 1}
REMOVING = {"os.remove", "os.rmdir", "os.rename"}
LEFT = "left behind"
LOGGERS = ["", "transformers", "accelerate", "torch"]  # "" is the root logger
IMPORTED = "imported"  # a snapshot's record of which of LOGGERS' libraries were imported: compared, never reported
# Each library's logger (level, handlers) right after its first import in this process (_AfterImport): what a test that
# imports the library first is compared against.
_AFTER_IMPORT = {}
# Module name -> (module, copy of its namespace), kept from test to test and refreshed where a test changed it; modules of
# pytest and its plugins, conftest files and test modules are not compared (their state is theirs), nor ``warnings``,
# whose functions pytest's warnings plugin replaces and puts back around every test.
_NAMESPACES = {}
_LAST = {}  # sys.modules' values, their namespaces, sizes and values at the last comparison: its fast path
# Set by pytest when a test fails (the interpreter's record of the last uncaught error), removed when one passes.
IGNORED_ATTRIBUTES = {"sys.last_type", "sys.last_value", "sys.last_traceback", "sys.last_exc"}
OWN_PACKAGES = ("_pytest", "pytest", "pluggy", "xdist", "execnet", "py", "pytest_global_state", "warnings")
C_UNSET = "<unset>"
PROPERTY = "pytest_global_state"  # the teardown report's user property carrying a worker's new files to the controller
_SNAPSHOTS = {}
# shared: an xdist worker beside others; made: the watched folders' entries this process created during the current
# test's call (its audit hook; None outside a call); created: every path it created then; kept: the top-level entries
# holding pytest's --basetemp, not compared.
# On the controller, charged: the entries a worker charged to a test; seen: for each other new entry, the tests that saw
# it appear; left: (what, tests) for each entry it reports.
_SESSION = {"config": None, "folders": {}, "log": None, "shared": False, "made": None, "created": set(), "kept": []}
_SESSION.update(
    charged=set(), seen={}, left=[], libraries={name for name in LOGGERS if name}, **{"test modules": set()}
)
_AUDITING = []
_MAIN_THREAD = threading.main_thread().ident


class Unreadable:
    """The value of a setting whose getter raised: equal to another when the error reads the same; never set back."""

    def __init__(self, error: Exception):
        first_line = (str(error).strip().splitlines() or [""])[0]
        self.text = f"{type(error).__name__}: {first_line}"

    def __eq__(self, other):
        return isinstance(other, Unreadable) and other.text == self.text

    def __repr__(self):
        return f"<getter raised {self.text}>"


def _read(get):
    try:
        return get()
    except Exception as error:  # noqa: BLE001 - any getter may raise; the snapshot must not
        return Unreadable(error)


def _attribute(owner, path: str):
    """(getter, setter) of ``owner.<path>`` (dotted), resolved when called."""
    parent, _, name = path.rpartition(".")
    get_parent = operator.attrgetter(parent) if parent else lambda obj: obj
    return (lambda: operator.attrgetter(path)(owner)), (lambda value: setattr(get_parent(owner), name, value))


def _precision(torch) -> list:
    """(name, getter, setter) of TF32 and fp32 precision through the API this torch uses."""
    paths = FP32_PRECISION if hasattr(torch.backends, "fp32_precision") else LEGACY_TF32
    return [(f"torch.backends.{path}", *_attribute(torch.backends, path)) for path in paths]


def _umask() -> int:
    try:  # Linux >= 4.7: read without setting it, even for an instant
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def _enable_faulthandler(enabled: bool) -> None:
    if enabled:  # pytest's faulthandler plugin writes to a copy of stderr's descriptor; its number is not public
        faulthandler.enable(file=sys.__stderr__)
    else:
        faulthandler.disable()


def _settings() -> list:
    """(name, getter, setter) of each setting outside torch; numpy's error handling where numpy is imported."""
    settings = [
        (
            "multiprocessing start method",
            lambda: multiprocessing.get_start_method(allow_none=True),
            lambda v: multiprocessing.set_start_method(v, force=True),  # None, forced: unset again
        ),
        ("socket default timeout", socket.getdefaulttimeout, socket.setdefaulttimeout),
        ("umask", _umask, os.umask),
        ("locale", lambda: locale.setlocale(locale.LC_ALL), lambda v: locale.setlocale(locale.LC_ALL, v)),
        ("faulthandler enabled", faulthandler.is_enabled, _enable_faulthandler),
        ("gc enabled", gc.isenabled, lambda v: gc.enable() if v else gc.disable()),
        ("gc thresholds", gc.get_threshold, lambda v: gc.set_threshold(*v)),
        ("recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
    ]
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "geterr"):
        settings.append(("numpy floating-point error handling", numpy.geterr, lambda v: numpy.seterr(**v)))
    return settings


def _flags():
    """(name, getter, setter) for each setting of the snapshot read through a getter, in the order they are put back;
    torch's when torch is imported."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "backends"):
        return _settings()
    cudnn = torch.backends.cudnn
    # What torch.set_printoptions writes (torch has no getter): a copy of the object's attributes.
    print_options = getattr(getattr(torch, "_tensor_str", None), "PRINT_OPTS", None)
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
        # Before the fp32_precision settings, which it derives from on torch >= 2.9: theirs are put back last.
        ("torch float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        *_precision(torch),
        ("torch grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("torch anomaly detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("torch intra-op threads", torch.get_num_threads, torch.set_num_threads),
        ("torch print options", lambda: dict(vars(print_options)), lambda v: vars(print_options).update(v)),
        *_settings(),
    ]


def _entries(folder: str) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name + ("/" if e.is_dir() else "") for e in entries)
    except OSError as error:
        return [repr(Unreadable(error))]


def _c_environ():
    """The process's own environment block (``environ``), as ``os.putenv`` and C code change it; None where the C
    library does not export it."""
    try:
        return ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None


_ENVIRON = _c_environ()


def _putenv_only() -> dict:
    """The variables where the process's environment block differs from ``os.environ`` (``os.putenv`` or
    ``os.unsetenv`` without ``os.environ``): name -> the block's value, or C_UNSET."""
    if _ENVIRON is None or not _ENVIRON:
        return {}
    block, index = {}, 0
    while (entry := _ENVIRON[index]) is not None:
        name, _, value = os.fsdecode(entry).partition("=")
        block.setdefault(name, value)
        index += 1
    python = os.environ
    found = {k: v for k, v in block.items() if python.get(k) != v and k not in IGNORED_ENVIRONMENT}
    found.update((k, C_UNSET) for k in python.keys() - block.keys() - IGNORED_ENVIRONMENT)
    return found


def snapshot() -> dict:
    state = {name: _read(get) for name, get, _ in _flags()}
    if "torch" in sys.modules:
        state["torch inter-op threads"] = _read(sys.modules["torch"].get_num_interop_threads)
    state["environment"] = {k: v for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT}
    state["environment block, not os.environ"] = _putenv_only()
    state["signal handlers"] = {signal.Signals(s).name: signal.getsignal(s) for s in SIGNALS}
    state["sys.modules"] = dict(sys.modules)
    state["working directory"] = os.getcwd()
    for label, folder in _SESSION["folders"].items():
        state[label] = _entries(folder)
    state["log levels"] = {name or "root": logging.getLogger(name).level for name in LOGGERS}
    state["logging handlers"] = {name or "root": list(logging.getLogger(name).handlers) for name in LOGGERS}
    state["logging.disable level"] = logging.root.manager.disable
    # A library configures its own logger when it is first imported: not a change made by the test that imports it.
    state[IMPORTED] = {name: name in sys.modules for name in LOGGERS if name}
    state["sys.path"] = list(sys.path)
    # Daemon threads (tqdm's monitor, ...) do not keep the process alive; the others do. Compared by identity: a thread
    # that ends is nobody's change, a new one still running is the test's.
    state["non-daemon threads"] = [t for t in threading.enumerate() if not t.daemon]
    return state


def _plugins_own(module) -> bool:
    """Whether ``module`` (a module name) is a registered pytest plugin's (conftest files included)."""
    config = _SESSION["config"]
    if config is None or module is None:
        return False
    return any(getattr(plugin, "__name__", None) == module for plugin in config.pluginmanager.get_plugins())


def _plugin_handler(handler) -> bool:
    """Whether a signal handler is the default or a function of a registered pytest plugin."""
    return handler in (signal.SIG_DFL, None) or _plugins_own(getattr(handler, "__module__", None))


def _describe(value) -> str:
    function = getattr(value, "__func__", value)
    if callable(value) and hasattr(function, "__qualname__") and hasattr(function, "__module__"):
        return f"{function.__module__}.{function.__qualname__}"
    return repr(value)


def _note_made(event: str, args: tuple) -> None:
    """Audit hook, during a test: notes each path this process's Python creates, and each top-level entry of a watched
    folder it creates that was not there an instant before (what the test's teardown may delete), until it removes it."""
    made = _SESSION["made"]
    if made is None or (event not in CREATING and event not in REMOVING) or threading.get_ident() != _MAIN_THREAD:
        return
    try:  # an exception here would abort the operation being audited
        if event == "open":
            if isinstance(args[0], int) or not (isinstance(args[2], int) and args[2] & os.O_CREAT):
                return  # a file descriptor, or no creation
        elif args[-1] != -1 or (event in ("os.rename", "os.link") and args[2] != -1):
            return  # a path relative to a folder's descriptor
        source = os.path.abspath(os.fsdecode(args[0]))
        # A rename of what was there before the test, or of another's: the new name holds none of the test's making.
        ours = event != "os.rename" or _created(source)
        if event in REMOVING:
            _SESSION["created"].discard(source)
            made.difference_update(_names(source))
        if event not in CREATING or not ours:
            return
        path = os.path.abspath(os.fsdecode(args[CREATING[event]]))
        if not os.path.lexists(path):  # an existing one (`makedirs(exist_ok=True)`, `open("a")`) is not made here
            made.update(_names(path))
            _SESSION["created"].add(path)
    except Exception:  # noqa: BLE001, S110
        pass


def _names(path: str) -> list[str]:
    """How the snapshot names ``path`` when it is a top-level entry of a watched folder (without a folder's slash)."""
    folders = _SESSION["folders"].items()
    return [f"{label}: {os.path.basename(path)}" for label, folder in folders if os.path.dirname(path) == folder]


def _top_entries(path: str) -> list[str]:
    """How the snapshot names the top-level entries of the watched folders that are ``path`` or hold it."""
    names = []
    for label, folder in _SESSION["folders"].items():
        relative = os.path.relpath(path, folder)
        if relative != os.curdir and not relative.startswith(os.pardir):
            names.append(f"{label}: {relative.split(os.sep)[0]}")
    return names


def _created(path: str) -> bool:
    """Whether this process's Python created ``path``, or a folder above it, during the test."""
    while path not in _SESSION["created"]:
        path, child = os.path.dirname(path), path
        if path == child:
            return False
    return True


def _added_and_removed(old: list, new: list) -> list[str]:
    added, removed = [x for x in new if x not in old], [x for x in old if x not in new]
    return [
        f"{word} {', '.join(map(repr, items))}" for word, items in (("added", added), ("removed", removed)) if items
    ]


def _first_imported_folders(old: dict, new: dict) -> tuple[str, ...]:
    """The folders (with a trailing separator) of the packages in ``new`` that ``old`` did not hold."""
    files = (getattr(module, "__file__", None) for name, module in new.items() if name not in old)
    return tuple(os.path.dirname(f) + os.sep for f in files if f and os.path.basename(f) == "__init__.py")


def changes(before: dict, after: dict) -> list[tuple[str, str]]:
    """(what changed, how) for each difference between two snapshots."""
    found = []
    # The loggers of the libraries first imported during the test: their import configured them.
    first_imported = {name for name, was in before[IMPORTED].items() if not was and after[IMPORTED].get(name)}
    for key in before:
        old, new = before[key], after.get(key)
        if old == new or key == IMPORTED:
            continue
        if key in _SESSION["folders"]:
            left = [f"{key}: {name}" for name in sorted(set(new) - set(old))]
            found += [(what, LEFT) for what in left if what.rstrip("/") not in _SESSION["kept"]]  # pytest's basetemp
        elif key == "non-daemon threads":
            started = [thread.name for thread in new if thread not in old]  # one that ended is not a change
            if started:
                found.append((key, "started, still running: " + ", ".join(map(repr, started))))
        elif key == "sys.modules":
            # A module imported for the first time is not a change; one replaced or removed is.
            for name, module in old.items():
                if new.get(name) is not module:
                    how = "removed" if name not in new else f"replaced by {new[name]!r}"
                    found.append((f"{key}: {name}", how))
        elif key == "sys.path":
            # Entries added or removed; not an entry that is already there put in front again (pytest's rootdir and
            # test folders, ``python -m``'s working directory), which made clean tests fail in the workbench's level runs;
            # nor one inside the folder of a package first imported during the test (setuptools adds its own
            # ``_vendor`` on its first import, reached through ``torch.compile`` in upstream's tests/trainer).
            imported = _first_imported_folders(before["sys.modules"], after["sys.modules"])
            how = "; ".join(_added_and_removed(old, [x for x in new if x in old or not x.startswith(imported)]))
            if how:
                found.append((key, how))
        elif key == "logging handlers":
            for name in old:
                if name in first_imported:
                    continue
                # pytest's log capture adds its own handlers to the root logger around each phase of a test
                added = [h for h in new[name] if h not in old[name] and not _plugins_own(type(h).__module__)]
                how = "; ".join(_added_and_removed(old[name], [h for h in old[name] if h in new[name]] + added))
                if how:
                    found.append((f"{key}: {name}", how))
        elif key == "environment block, not os.environ":
            for k in sorted(old.keys() | new.keys()):
                was, now = old.get(k, "as in os.environ"), new.get(k, "as in os.environ")
                if was != now:
                    found.append((f"{key}: {k}", f"{was!r} -> {now!r}"))
        elif isinstance(old, dict):
            for k in sorted(old.keys() | new.keys()):
                was, now = old.get(k, "<unset>"), new.get(k, "<unset>")
                if was == now or (key == "log levels" and k in first_imported):
                    continue
                if key == "signal handlers" and _plugin_handler(was) and _plugin_handler(now):
                    continue  # a plugin's own handler, installed or reset by the plugin: not the test's doing
                shown = (_describe(was), _describe(now)) if key == "signal handlers" else (repr(was), repr(now))
                found.append((f"{key}: {k}", " -> ".join(shown)))
        else:
            found.append((key, f"{old!r} -> {new!r}"))
    return found


def restore(before: dict, changed: list[tuple[str, str]], made: set[str]) -> dict[str, str]:
    """Puts back what changed and can be put back, and deletes the files and folders left behind that are in ``made``
    (this process's Python made them during the test). Returns, for each line of ``changed`` not put back, what became
    of it instead and why."""
    reported = {what for what, _ in changed}
    kinds = {what.partition(": ")[0] for what in reported}
    notes = {
        "non-daemon threads": "not stopped: a thread cannot be stopped from outside",
        "torch inter-op threads": "not put back: torch allows setting it once per process",
    }
    notes = {what: note for what, note in notes.items() if what in reported}
    for what in [what for what, how in changed if how == LEFT]:
        notes[what] = _delete(what) if what.rstrip("/") in made else "not deleted: not seen made by this process"
    for name, _, set_value in _flags():
        value = before.get(name)
        if name not in kinds:
            continue
        if isinstance(value, Unreadable):
            notes[name] = "not put back: its getter raised before the test"
            continue
        try:
            set_value(value)
        except Exception as error:  # noqa: BLE001 - best effort: the difference is reported, and so is this
            notes[name] = f"not put back: {Unreadable(error).text}"
    for name in set(os.environ) - set(before["environment"]) - IGNORED_ENVIRONMENT:
        del os.environ[name]
    os.environ.update(before["environment"])  # writes each variable through to the environment block too
    for what in reported:
        kind, _, name = what.partition(": ")
        if kind == "environment block, not os.environ":
            value = before[kind].get(name, os.environ.get(name, C_UNSET))
            os.unsetenv(name) if value == C_UNSET else os.putenv(name, value)
        elif kind == "sys.modules":
            sys.modules[name] = before[kind][name]
    for name, handler in before["signal handlers"].items():
        if handler is not None and f"signal handlers: {name}" in reported:
            signal.signal(signal.Signals[name], handler)
    os.chdir(before["working directory"])
    for name, level in before["log levels"].items():
        if f"log levels: {name}" in reported:
            logging.getLogger("" if name == "root" else name).setLevel(level)
    if "logging.disable level" in reported:
        logging.disable(before["logging.disable level"])
    if "sys.path" in reported:
        sys.path[:] = before["sys.path"]
    for name, handlers in before["logging handlers"].items():
        if f"logging handlers: {name}" in reported:
            logger = logging.getLogger("" if name == "root" else name)
            for handler in logger.handlers[:]:
                if handler not in handlers and not _plugins_own(type(handler).__module__):
                    logger.removeHandler(handler)
            for handler in handlers:
                logger.addHandler(handler)  # does nothing for a handler still there
    return notes


def _delete(what: str) -> str:
    """Deletes a top-level entry of a watched folder (a symbolic link itself, never what it points to)."""
    label, _, name = what.partition(": ")
    path = os.path.join(_SESSION["folders"][label], name.rstrip("/"))
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as error:
        return f"not deleted: {Unreadable(error).text}"
    return "deleted"


def _own_module(name: str) -> bool:
    """Whether a module's state is pytest's, a plugin's or the tests' own (conftest files and test modules)."""
    return name.partition(".")[0] in OWN_PACKAGES or name in _SESSION["test modules"] or _plugins_own(name)


def namespace_changes() -> list[tuple[str, str, object]]:
    """(module, attribute, its value before, what it is now) for each function, class, module or other callable that a module held
    before the test and holds no longer (replaced or deleted); other values (counters, caches filled on first use) are
    the library's own state. Compares every module's namespace with its copy from the end of the previous test (a first
    import is copied, not compared) and refreshes the copies of those that changed."""
    if _unchanged():
        return []
    found = []
    for name, module in list(sys.modules.items()):
        namespace = module.__dict__ if isinstance(module, ModuleType) else None
        module_before, copy = _NAMESPACES.get(name, (None, None))
        if namespace is None:
            continue
        # By identity (not ==, which calls the values' __eq__: sympy's is slow, numpy's raises), in C; a name added or
        # deleted shifts the values, and the attributes are compared one by one.
        if module_before is module and len(namespace) == len(copy):
            if all(map(operator.is_, namespace.values(), copy.values())):
                continue
        if module_before is module and not _own_module(name):
            for attribute, value in copy.items():
                now = namespace.get(attribute, copy)  # the copy itself: deleted
                if now is value or f"{name}.{attribute}" in IGNORED_ATTRIBUTES:
                    continue
                shown = "deleted" if now is copy else _describe(now)
                # A function wrapped again under its own name (torch rebinds some lazily) is the library's doing.
                if (callable(value) or isinstance(value, ModuleType)) and shown != _describe(value):
                    found.append((name, attribute, value, shown))
        _NAMESPACES[name] = (module, namespace.copy())
    modules, namespaces = list(sys.modules.values()), []
    for name, module in zip(list(sys.modules), modules):
        # pytest's own (it rebinds some names around every test) as an empty namespace: compared one by one, they would
        # make the fast path fail every time
        own = name.partition(".")[0] in OWN_PACKAGES or name in _SESSION["test modules"] or name == "sys"
        namespaces.append(module.__dict__ if isinstance(module, ModuleType) and not own else {})
    _LAST.update(modules=modules, namespaces=namespaces, sizes=list(map(len, namespaces)))
    _LAST["values"] = list(itertools.chain.from_iterable(map(dict.values, namespaces)))
    return found


def _unchanged() -> bool:
    """Whether no module was imported or removed, and no name rebound, since the last comparison (pytest's own modules
    aside): one list of every namespace's values, compared in C, instead of a loop over the modules."""
    namespaces = _LAST.get("namespaces")
    if namespaces is None or list(sys.modules.values()) != _LAST["modules"]:
        return False
    if list(map(len, namespaces)) != _LAST["sizes"]:
        return False
    try:  # list equality tries identity first, in C; a value equal but not identical is taken as the same
        return list(itertools.chain.from_iterable(map(dict.values, namespaces))) == _LAST["values"]
    except Exception:  # noqa: BLE001 - a value's __eq__ may raise (arrays): compared one by one instead
        return False


class _AfterImport:
    """A meta path finder that only watches: it runs the import of each library of LOGGERS through the finders after
    it, and notes the library's logger (level, handlers) when the module's code has run (its import configured it)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _SESSION["libraries"] or name in sys.modules:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None or isinstance(loader, type):  # a class: its method is not this import's to wrap
            return spec

        def run(module):
            try:
                exec_module(module)
            finally:
                vars(loader).pop("exec_module", None)
                logger = logging.getLogger(name)
                _AFTER_IMPORT[name] = (logger.level, list(logger.handlers))

        try:
            loader.exec_module = run
        except (AttributeError, TypeError):
            pass
        return spec


def _log(record: dict) -> None:
    if _SESSION["log"]:
        with open(_SESSION["log"], "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def pytest_addoption(parser):
    parser.addoption(
        "--global-state-log",
        metavar="FILE",
        default=None,
        help="append one JSON line per test: the process-global state it left changed (utils/census.py reads it)",
    )


def pytest_configure(config):
    _SESSION["config"] = config
    _SESSION["log"] = config.getoption("--global-state-log")
    cwd, rootdir = os.getcwd(), str(config.rootpath)
    _SESSION["folders"] = {"files in the working directory": cwd}
    if os.path.realpath(rootdir) != os.path.realpath(cwd):
        _SESSION["folders"]["files in the rootdir"] = rootdir
    _SESSION.update(charged=set(), seen={}, left=[])
    basetemp = config.getoption("basetemp", None)
    _SESSION["kept"] = _top_entries(os.path.abspath(basetemp)) if basetemp else []
    workerinput = getattr(config, "workerinput", None)
    _SESSION["shared"] = workerinput is not None and workerinput.get("workercount", 2) > 1
    if not _AUDITING:
        sys.addaudithook(_note_made)  # cannot be removed: installed once per process
        _AUDITING.append(True)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def pytest_unconfigure(config):
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _AfterImport)]


def pytest_collection_finish(session):
    modules = {getattr(getattr(item, "module", None), "__name__", None) for item in session.items}
    _SESSION["test modules"] = modules - {None}
    namespace_changes()  # the copies every test is compared with
    _log({"collected": len(session.items), "folders": _SESSION["folders"]})


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _SESSION.update(made=None, created=set())
    _SNAPSHOTS[item.nodeid] = snapshot()
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    _SESSION["made"] = set()  # the test's own making: not its fixtures' set-up (a wider fixture's files are in use)
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        _check(item)


def _check(item) -> None:
    before = _SNAPSHOTS.pop(item.nodeid, None)
    if before is None:
        return
    for name, (level, handlers) in _AFTER_IMPORT.items():
        if not before[IMPORTED].get(name, True):  # first imported during the test: compared with the state right after
            before[IMPORTED][name] = True
            before["log levels"][name] = level
            before["logging handlers"][name] = handlers
    changed = changes(before, snapshot())
    fixed = ("multiprocessing start method", f"None -> {multiprocessing.get_all_start_methods()[0]!r}")
    if fixed in changed:
        # Unset to the platform's default: any use of the default context does it once per process, first of all
        # tqdm's first progress bar (its lock); put back and said, not the test's error.
        changed.remove(fixed)
        multiprocessing.set_start_method(None, force=True)
        warnings.warn(
            pytest.PytestWarning(f"{item.nodeid}: {fixed[0]} fixed to the platform's default ({fixed[1]}, put back)")
        )
    replaced = namespace_changes()
    changed += [
        (f"module attribute: {module}.{attribute}", f"{_describe(value)} -> {now}")
        for module, attribute, value, now in replaced
    ]
    files = [what for what, how in changed if how == LEFT]
    made, _SESSION["made"] = _SESSION["made"] or set(), None  # the audit hook notes nothing more until the next call
    if _SESSION["shared"]:
        # New entries this process did not make may be another worker's: the controller decides (pytest_sessionfinish).
        seen = [what for what in files if what.rstrip("/") not in made]
        changed = [(what, how) for what, how in changed if what not in seen]
        if files:
            charged = [what for what in files if what not in seen]
            item.user_properties.append((PROPERTY, {"charged": charged, "seen": seen}))
    _log({"test": item.nodeid, "changed": changed})
    if changed:
        notes = restore(before, changed, made)
        for module, attribute, value, _ in replaced:
            setattr(sys.modules[module], attribute, value)
        namespace_changes()  # refreshes the copies of the modules just put back
        raise AssertionError(
            f"{item.nodeid} left process-global state changed (each line says whether it was put back for the next test):\n  "
            + "\n  ".join(f"{what}: {how} ({notes.get(what, 'put back')})" for what, how in changed)
        )


def pytest_runtest_logreport(report):
    if hasattr(_SESSION["config"], "workerinput"):
        return  # only the controller sees every worker's reports
    for name, value in report.user_properties:
        if name == PROPERTY:
            _SESSION["charged"].update(value["charged"])
            for what in value["seen"]:
                _SESSION["seen"].setdefault(what, []).append(report.nodeid)


def _there(what: str) -> bool:
    label, _, name = what.partition(": ")
    return os.path.lexists(os.path.join(_SESSION["folders"][label], name.rstrip("/")))


def pytest_sessionfinish(session):
    """On the xdist controller: each new entry no worker charged to a test, still there, reported once."""
    seen, charged = _SESSION["seen"], _SESSION["charged"]
    left = [(what, sorted(tests)) for what, tests in sorted(seen.items()) if what not in charged and _there(what)]
    _SESSION["left"] = left
    for what, tests in left:
        _log({"left": what, "tests": tests})
    if left and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if not _SESSION["left"]:
        return
    terminalreporter.section("files left behind, attributed at the end of the session", sep="=", red=True)
    for what, tests in _SESSION["left"]:
        by = f"by {tests[0]}" if len(tests) == 1 else "while these ran on different workers: " + ", ".join(tests)
        terminalreporter.line(f"{what}: {LEFT} {by}")
