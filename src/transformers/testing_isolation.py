# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
Run a test in a fresh process, so that process-global state cannot leak into it.

`torch.use_deterministic_algorithms`, the cuDNN flags, the default dtype, the random number generators and environment
variables such as `CUBLAS_WORKSPACE_CONFIG` are global to a process. A test that changes one of them changes it for
every later test of the same pytest worker, which makes determinism tests flaky. Decorate such a test with
[`run_test_in_fresh_process`]:

```python
from parameterized import parameterized

from transformers.testing_isolation import run_test_in_fresh_process


class ResumeTest(TestCasePlus):
    @run_test_in_fresh_process
    def test_resume_is_exact(self):
        ...

    @parameterized.expand([("fp16",), ("bf16",)])  # `parameterized.expand` goes outermost
    @run_test_in_fresh_process(timeout=120, seed=0)
    def test_resume_is_exact_with(self, precision):
        ...


@run_test_in_fresh_process
def test_plain_function(tmp_path):
    ...
```

How it works:

- Each pytest process (each `pytest-xdist` worker too) lazily starts one server, the `multiprocessing` forkserver, the
  first time a decorated test runs. The server imports torch, `transformers` and `transformers.trainer`, and nothing
  else happens in it: it never runs a test and never initializes CUDA. It is started with the environment of
  [`isolated_environ`]: the environment captured by [`snapshot_environ`] plus [`ISOLATION_ENV`]
  (`CUBLAS_WORKSPACE_CONFIG=:4096:8` and `PYTHONHASHSEED=0`, which Python only reads at start-up).
- Each test runs in a child forked from that server. The child puts itself in its own process group, resets
  `os.environ` to [`isolated_environ`] (plus the `PYTEST_CURRENT_TEST` of the parent, and a `TMPDIR` of its own that
  the parent removes afterwards, so that temporary files are removed even when the child dies before its `tearDown`),
  imports the test module, calls [`~trainer_utils.enable_full_determinism`] with `seed` (which also exports a few
  variables, like `CUDA_LAUNCH_BLOCKING`; the values of [`ISOLATION_ENV`] are kept) and runs the test: for a
  `unittest.TestCase` method, a new instance of the class runs `setUpModule`, `setUpClass`, `setUp`, the test,
  `tearDown`, the cleanups, `tearDownClass` and `tearDownModule`, through `unittest` itself; a plain function is simply
  called. Arguments (the parameters of `parameterized.expand`, pytest fixtures values) are pickled from the parent.
- The outcome is replayed in the parent: a pass passes, a failure raises [`FreshProcessTestFailure`] with the
  traceback of the child, a skip (`unittest.SkipTest`, `pytest.skip`) skips with the same reason, `pytest.xfail`
  xfails. `unittest.expectedFailure` is applied once, by the parent's runner, to the outcome of the child: a failing
  body is an expected failure, a passing one an unexpected success. A child killed by a signal, or still running after
  `timeout` seconds, fails the test. What the child wrote to its stdout and stderr (file descriptors 1 and 2) is
  printed in the parent, where pytest captures it, and is added to the failure message.
- Processes are cleaned up: on timeout, or when the parent is interrupted (a Ctrl-C does not reach the child's process
  group), the parent kills the child's whole process group; a child that finishes kills its own process group, and
  with it whatever the test left running; on Linux, the child (not what it started) is killed if the server dies,
  which it does with the pytest process.

Decorator order: `parameterized.expand` goes above this decorator, `mock.patch` below it (its mocks are made in the
child). `unittest.skip`, `skipIf`, `skipUnless`, `expectedFailure` and pytest marks work on either side, and on the
class: the parent's runner applies them, and a skipped test starts no child.

Limitations: the test body cannot use objects that live only in the parent (pytest fixtures such as `caplog`,
`capsys` or `monkeypatch`, mocks passed by an outer `mock.patch` decorator): arguments must be picklable, and state the
body changes is not seen by the parent. Fixtures run twice, once in the parent and once in the child: `setUpModule`,
`setUpClass` and `setUp`, and their tear-downs. Where the platform has no forkserver, children are spawned instead,
which re-imports torch for every test. Process groups, signals and timeouts are POSIX features; only Linux is tested.
"""

import contextlib
import functools
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import traceback
import unittest

from .utils import logging


logger = logging.get_logger(__name__)

ISOLATION_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}
"""Environment variables set for the server and for every test child on top of [`snapshot_environ`]."""

# Imported once by the server, so that children start with them already imported; every child checks they are.
PRELOADED_MODULES = ("torch", "transformers", "transformers.trainer", "transformers.testing_isolation")
# Also preloaded where installed. Not `transformers.testing_utils`: it calls `torch.cuda.is_available()` on import.
_OPTIONAL_PRELOADED_MODULES = ("pytest",)

# Set by pytest for the test being run: taken from the parent when a test starts, never from the snapshot.
_PER_TEST_VARIABLE = "PYTEST_CURRENT_TEST"
_OUTPUT_FILE = "output.txt"
_RESULT_FILE = "result.pickle"

_environ_snapshot = None
_context = None
_in_fresh_process = False


class FreshProcessTestFailure(AssertionError):
    """Raised in the parent when a test run by [`run_test_in_fresh_process`] failed, crashed or timed out."""


def snapshot_environ() -> dict[str, str]:
    """
    Returns the environment the tests of this process are meant to see.

    The snapshot of `os.environ` is taken the first time this function is called, which is when this module is first
    imported (during pytest's collection), before any test could change the environment. `PYTEST_CURRENT_TEST` is left
    out of it.
    """
    global _environ_snapshot
    if _environ_snapshot is None:
        _environ_snapshot = {key: value for key, value in os.environ.items() if key != _PER_TEST_VARIABLE}
    return dict(_environ_snapshot)


snapshot_environ()


def isolated_environ() -> dict[str, str]:
    """Returns [`snapshot_environ`] updated with [`ISOLATION_ENV`]: the environment of the server and of each child."""
    return {**snapshot_environ(), **ISOLATION_ENV}


def run_test_in_fresh_process(func=None, *, timeout: float = 600, seed: int = 42):
    """
    Decorator running a test in a fresh process forked from a server that has imported torch and transformers, with a
    pristine environment and full determinism enabled. See the documentation of this module for the details.

    Can be used bare (`@run_test_in_fresh_process`) or with arguments (`@run_test_in_fresh_process(timeout=60)`), on a
    `unittest.TestCase` method (below `parameterized.expand`, if any) or on a module-level function.

    Args:
        func (`Callable`, *optional*):
            The test, when the decorator is used bare.
        timeout (`float`, *optional*, defaults to 600):
            Seconds after which the child and its process group are killed and the test fails.
        seed (`int`, *optional*, defaults to 42):
            The seed given to [`~trainer_utils.enable_full_determinism`] before the test runs.
    """
    if func is None:
        return functools.partial(run_test_in_fresh_process, timeout=timeout, seed=seed)

    # `functools.wraps` also copies `func.__dict__`: the markers of decorators placed below this one (`unittest.skip`,
    # `unittest.expectedFailure`, pytest marks) reach the runner of the parent, which applies them.
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if _in_fresh_process:
            return func(*args, **kwargs)
        request = _make_request(func, args, kwargs, seed)
        _replay(_run_in_child(request, timeout), func.__qualname__, timeout)

    wrapper._fresh_process_body = func
    return wrapper


def _make_request(func, args, kwargs, seed):
    """Describes the test so that the child can find it: by module and attribute names, not by pickling it."""
    testcase = args[0] if args and isinstance(args[0], unittest.TestCase) else None
    if testcase is None:
        module, scope, candidates = sys.modules[func.__module__], None, [func.__qualname__]
    else:  # `_testMethodName` is the name `parameterized.expand` generated, `__name__` the one in the class body
        module, scope, candidates = sys.modules[type(testcase).__module__], type(testcase), [testcase._testMethodName]
        candidates.append(func.__name__)
        args = args[1:]
    attribute = next((name for name in candidates if _find_body(scope or module, name) is func), None)
    if attribute is None:
        raise TypeError(
            f"`run_test_in_fresh_process` cannot find {func.__qualname__} again in a new process: decorate a "
            "module-level function or a method of a `unittest.TestCase` (with `parameterized.expand` outermost)."
        )
    environ = isolated_environ()
    if _PER_TEST_VARIABLE in os.environ:
        environ[_PER_TEST_VARIABLE] = os.environ[_PER_TEST_VARIABLE]
    return {
        "module": (module.__name__, getattr(module, "__file__", None)),
        "testcase_class": scope.__qualname__ if scope is not None else None,
        "test_method": testcase._testMethodName if testcase is not None else None,
        "attribute": attribute,
        "arguments": pickle.dumps((args, kwargs)),
        "environ": environ,
        "seed": seed,
        "preloaded": PRELOADED_MODULES if _get_context().get_start_method() == "forkserver" else (),
    }


def _find_body(owner, attribute):
    """
    Returns the function behind `owner.<attribute>`: the one wrapped by this decorator if there is one (following
    `__wrapped__`, and `place_as` which `parameterized.expand` sets), else the attribute itself.
    """
    try:
        found = functools.reduce(getattr, attribute.split("."), owner)
    except AttributeError:
        return None
    candidate = found
    while candidate is not None and not hasattr(candidate, "_fresh_process_body"):
        candidate = getattr(candidate, "__wrapped__", None) or getattr(candidate, "place_as", None)
    return found if candidate is None else candidate._fresh_process_body


def _get_context():
    """The `multiprocessing` context children are started with: forkserver, or spawn where there is none."""
    global _context
    if _context is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload([*PRELOADED_MODULES, *_OPTIONAL_PRELOADED_MODULES])
        else:
            logger.warning("No forkserver on this platform: tests run in fresh processes are spawned (slower).")
            _context = multiprocessing.get_context("spawn")
    return _context


@contextlib.contextmanager
def _launch_environ():
    """
    Puts [`isolated_environ`] in `os.environ` while a process is launched: `multiprocessing` gives the server (started
    by the first child) and spawned children the environment of the parent at that moment.
    """
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(isolated_environ())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_in_child(request, timeout):
    """
    Runs the test in a child and returns `(result, timed_out, exit code, output)`; `result` is `None` if the child
    reported none.
    """
    with tempfile.TemporaryDirectory(prefix="fresh_process_") as workdir:
        # The child's temporary files go to the workdir, removed even when the child dies before its `tearDown`.
        tmpdir = os.path.join(workdir, "tmp")
        os.mkdir(tmpdir)
        request = {**request, "workdir": workdir, "environ": {**request["environ"], "TMPDIR": tmpdir}}
        open(os.path.join(workdir, _OUTPUT_FILE), "wb").close()  # exists even if the child dies before writing
        process = _get_context().Process(target=_child_main, args=(request,), name="fresh_process_test")
        with _launch_environ():
            process.start()
        try:
            process.join(timeout)
            timed_out = process.exitcode is None
        finally:
            # Timed out, or the parent was interrupted: a Ctrl-C does not reach the child, in its own process group.
            if process.exitcode is None:
                _kill_process_group(process)
            process.join()
        with open(os.path.join(workdir, _OUTPUT_FILE), encoding="utf-8", errors="replace") as f:
            output = f.read()
        result_path = os.path.join(workdir, _RESULT_FILE)
        result = None
        if os.path.exists(result_path):
            with open(result_path, "rb") as f:
                result = pickle.load(f)
    return result, timed_out, process.exitcode, output


def _kill_process_group(process):
    """
    Kills the child's process group, or the child alone if it has none yet. Only while the child runs: once it has
    exited and been reaped (by the forkserver), its pid, the id of its group, may be given to an unrelated process.
    """
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, AttributeError):  # no such group (yet), or no process groups (Windows)
        process.kill()


def _replay(run, name, timeout):
    """Gives the parent the outcome of the child: return, or raise the matching exception."""
    __tracebackhide__ = True
    result, timed_out, exitcode, output = run
    if output:
        print(output, end="" if output.endswith("\n") else "\n")
    if timed_out:
        reason = f"timed out after {timeout} s (its process group was killed)"
    elif result is None and exitcode is not None and exitcode < 0:
        reason = f"crashed: killed by signal {signal.Signals(-exitcode).name}"
    elif result is None:
        reason = f"exited with code {exitcode} without reporting a result"
    else:
        reason = None
    if reason is not None:
        raise FreshProcessTestFailure(f"{name} {reason} in a fresh process.{_format_output(output)}")
    outcome, message = result
    if outcome == "skipped":
        raise unittest.SkipTest(message)
    if outcome == "xfailed":
        import pytest

        pytest.xfail(message)
    if outcome == "failed":
        raise FreshProcessTestFailure(f"{name} failed in a fresh process:\n{message}{_format_output(output)}")


def _format_output(output):
    return f"\n---------- output of the fresh process ----------\n{output}" if output else ""


def _child_main(request):
    """Entry point of the child: runs the test and writes its outcome, as `(outcome, message)`, to the workdir."""
    global _in_fresh_process
    _in_fresh_process = True
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    _die_with_parent()
    _redirect_output(os.path.join(request["workdir"], _OUTPUT_FILE))
    try:
        result = _run_test(request)
    except BaseException as exception:
        result = _describe(exception)
    sys.stdout.flush()
    sys.stderr.flush()
    result_path = os.path.join(request["workdir"], _RESULT_FILE)
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(result_path + ".tmp", result_path)
    # Kill what the test left running in the group, and this process with it. The parent cannot do it safely: once
    # the child has exited, the id of its group may be reused.
    if hasattr(os, "setpgrp") and os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _die_with_parent():
    """
    On Linux, asks the kernel to kill the child when its parent dies (best effort). The parent is the forkserver, which
    exits when the pytest process that started it dies, even of a `SIGKILL`: when no process holds the write end of its
    "alive" pipe any more. Every child gets a copy of it, which it does not need: closed, so that the child does not
    keep the server, and so itself, running.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _redirect_output(path):
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _check_preloaded(names):
    """Fails unless the modules were imported by the server: the forkserver ignores preload errors silently."""
    import importlib

    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return
    try:
        for name in missing:
            importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(f"The forkserver could not preload {missing}.") from error
    raise RuntimeError(
        f"The forkserver did not preload {missing}: other code of this process started it before "
        "`run_test_in_fresh_process` did."
    )


def _run_test(request):
    _check_preloaded(request["preloaded"])
    os.environ.clear()
    os.environ.update(request["environ"])
    tempfile.tempdir = None  # read `TMPDIR` again
    module = _import_module(*request["module"])
    args, kwargs = pickle.loads(request["arguments"])

    from transformers.trainer_utils import enable_full_determinism

    enable_full_determinism(request["seed"])
    os.environ.update(ISOLATION_ENV)

    if request["testcase_class"] is None:
        _find_body(module, request["attribute"])(*args, **kwargs)
        return "passed", ""
    testcase_class = functools.reduce(getattr, request["testcase_class"].split("."), module)
    body = _find_body(testcase_class, request["attribute"])
    testcase = testcase_class(request["test_method"])
    # `unittest` runs the instance (fixtures, cleanups, subtests), with the body and the arguments of the parent.
    setattr(testcase, request["test_method"], functools.partial(body, testcase, *args, **kwargs))
    recorder = _OutcomeRecorder()
    unittest.TestSuite([testcase]).run(recorder)
    return recorder.result


def _import_module(name, path):
    """Imports the module by name, or from its file when pytest imported it without putting it on `sys.path`."""
    import importlib.util

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if path is None or not (name == error.name or name.startswith(f"{error.name}.")):
            raise
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _OutcomeRecorder(unittest.TestResult):
    """A `unittest` result keeping the first outcome that is not a pass, as `(outcome, message)`."""

    result = ("passed", "")

    def _record(self, result):
        if self.result[0] == "passed":
            self.result = result

    def addError(self, test, err):
        self._record(_describe(err[1]))

    addFailure = addError

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._record(_describe(err[1]))

    def addSkip(self, test, reason):
        self._record(("skipped", reason))

    # `unittest.expectedFailure` is applied once, by the runner of the parent, to the outcome of the child: here an
    # expected failure is a failure, and an unexpected success a pass.
    def addExpectedFailure(self, test, err):
        self._record(_describe(err[1]))


def _describe(exception):
    """Turns an exception raised by a test into `(outcome, message)`."""
    if isinstance(exception, unittest.SkipTest):
        return "skipped", str(exception)
    pytest = sys.modules.get("pytest")
    if pytest is not None and isinstance(exception, pytest.skip.Exception):
        return "skipped", exception.msg
    if pytest is not None and isinstance(exception, pytest.xfail.Exception):
        return "xfailed", exception.msg
    # Start the traceback at the test: drop the frames of `unittest` and of this module that called it.
    frames = exception.__traceback__
    while frames is not None and frames.tb_frame.f_globals.get("__name__", "").startswith(("unittest", __name__)):
        frames = frames.tb_next
    return "failed", "".join(traceback.format_exception(type(exception), exception, frames))
