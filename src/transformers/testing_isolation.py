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

- Each pytest process (each `pytest-xdist` worker too) has its own test server, which forks one child per test. The
  server is made while pytest imports the test modules, before any test runs: the first time a test is decorated, the
  process forks a copy of itself, which leaves what pytest set up for the collection (output capture, warning
  recording, log handlers, signal handlers), takes the environment of [`isolated_environ`] and waits. If a later test
  module imports more of [`PRELOADED_MODULES`], the copy is made again, until a test uses it. The first test that
  needs it has it import what is still missing of [`PRELOADED_MODULES`] and warm up (see `_warm_up`). This is the
  server on Linux, under pytest 8.2 or later, when torch is built for the CPU only and no thread was started since
  this module was imported (see `_can_fork_server`). Otherwise (a CUDA, ROCm or XPU build, whose driver the test
  modules may have started and a forked process cannot use, for one), and to replace a server that died, the server
  is a new Python interpreter (`subprocess`) started by the first test that needs it, with the same environment, which
  imports and warms up the same way. Either way, nothing else in the process can reach it or replace it: `multiprocessing`
  start methods, DataLoader workers or a forkserver started by other tests do not affect it. It never runs a test and
  never initializes CUDA, and it exits when the pytest process is gone (its request pipe closes).
- Each test runs in a child the server forks. The child puts itself in its own process group, dies with the server
  (Linux), sends its output to a file the parent reads (with `faulthandler` on, so a crash shows where), resets
  `os.environ` to [`isolated_environ`] (plus the `PYTEST_CURRENT_TEST` of the parent, and a `TMPDIR` of its own),
  takes the parent's `sys.path` and working directory, imports the test module (unless the server has it), calls
  [`~trainer_utils.enable_full_determinism`] with `seed` and runs the test: for a `unittest.TestCase` method, a new
  instance of the class runs `setUpModule`, `setUpClass`, `setUp`, the test, `tearDown`, the cleanups,
  `tearDownClass` and `tearDownModule` through `unittest` itself; a plain function is simply called. Arguments (the
  parameters of `parameterized.expand`, pytest fixture values) are pickled from the parent.
- In the parent, `setUp`, `tearDown` (and `setUpClass`, `tearDownClass` when every test of the class runs in a fresh
  process) are skipped for decorated tests: they run once, in the child. Module fixtures still run in the parent.
- The outcome is replayed in the parent: a pass passes, a failure (subtests included) raises
  [`FreshProcessTestFailure`] with the traceback of the child, a skip skips with the same reason, `pytest.xfail`
  xfails. `unittest.expectedFailure` is applied once, by the parent's runner. A child killed by a signal, one that
  exits without reporting, one still running after `timeout` seconds, or a server that died, fail the test with a
  message naming the test and the cause; the next test gets a new server if needed.
- Processes are cleaned up: when the child is gone, its whole process group is killed (by the server, which has not
  reaped the child yet, so the group id cannot have been reused); on timeout, or when the parent is interrupted, the
  parent asks the server to kill the group at once.

Decorator order: `parameterized.expand` goes above this decorator, `mock.patch` below it (its mocks are made in the
child). `unittest.skip`, `skipIf`, `skipUnless`, `expectedFailure` and pytest marks work on either side, and on the
class: the parent's runner applies them, and a skipped test starts no child.

Limitations: the test body cannot use objects that live only in the parent (pytest fixtures such as `caplog`,
`capsys` or `monkeypatch`, mocks passed by an outer `mock.patch` decorator): arguments must be picklable, and state the
body changes is not seen by the parent. A child of a forked server starts from the pytest process as it was before its
first test: with what `conftest.py` files and the test modules set when imported (upstream's root `conftest.py` turns
TF32 off, for example) and pytest's warning filters; a child of a new interpreter has neither. Python's string hashes
are randomized as in any process: `PYTHONHASHSEED` is only read when an interpreter starts, so set it for the whole
pytest run to fix them. Needs `os.fork` (POSIX); only Linux is tested.
"""

import contextlib
import faulthandler
import functools
import inspect
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest
import warnings

from .utils import logging


logger = logging.get_logger(__name__)

ISOLATION_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""Environment variables set for the server and for every test child on top of [`snapshot_environ`]."""

PRELOADED_MODULES = ("torch", "transformers", "transformers.trainer", "transformers.testing_isolation")
"""Modules the server imports before it forks any child."""
# Also imported by the server where installed. `transformers.testing_utils` calls `torch.cuda.is_available()` on
# import, which starts the CUDA driver: it is only preloaded when torch is built for the CPU only.
_OPTIONAL_PRELOADED_MODULES = ("pytest", "parameterized", "accelerate", "safetensors.torch")
_CPU_ONLY_PRELOADED_MODULES = ("transformers.testing_utils",)

# Set by pytest for the test being run: taken from the parent when a test starts, never from the snapshot.
_PER_TEST_VARIABLE = "PYTEST_CURRENT_TEST"
_OUTPUT_FILE = "output.txt"
_RESULT_FILE = "result.pickle"
_SERVER_STARTUP_TIMEOUT = 600
# How long the parent waits for the server to report a child it asked to kill before it kills the server itself.
_KILL_GRACE = 30

_environ_snapshot = None
_server = None
_server_lock = threading.Lock()
_in_fresh_process = False


class FreshProcessTestFailure(AssertionError):
    """Raised in the parent when a test run by [`run_test_in_fresh_process`] failed, crashed or timed out."""


def snapshot_environ() -> dict[str, str]:
    """
    Returns the environment the tests of this process are meant to see.

    The snapshot of `os.environ` is taken when this module is first imported (during pytest's collection), before any
    test could change the environment. `PYTEST_CURRENT_TEST` is left out of it.
    """
    global _environ_snapshot
    if _environ_snapshot is None:
        _environ_snapshot = {key: value for key, value in os.environ.items() if key != _PER_TEST_VARIABLE}
    return dict(_environ_snapshot)


snapshot_environ()


def _thread_count():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


# A thread started after this (by an OpenMP parallel region, for one) may belong to a pool that a forked process lacks.
_threads_at_import = _thread_count()


def isolated_environ() -> dict[str, str]:
    """Returns [`snapshot_environ`] updated with [`ISOLATION_ENV`]: the environment of the server and of each child."""
    return {**snapshot_environ(), **ISOLATION_ENV}


def run_test_in_fresh_process(func=None, *, timeout: float = 600, seed: int = 42, num_threads: int | None = None):
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
        num_threads (`int`, *optional*):
            The number of threads torch uses in the child (`torch.set_num_threads`). By default, torch's default for
            a new process, which is one thread per core: several `pytest-xdist` workers then compete for the cores,
            and tests of tiny models are fastest with `num_threads=1`.
    """
    if func is None:
        return functools.partial(run_test_in_fresh_process, timeout=timeout, seed=seed, num_threads=num_threads)
    _fork_server_while_collecting()

    # Applied in a class body (the frame calling this decorator, as `parameterized.expand` finds it): the class runs its
    # fixtures in the child only. Without frame introspection, fixtures would also run in the parent.
    frame = inspect.currentframe()
    namespace = frame.f_back.f_locals if frame is not None and frame.f_back is not None else {}
    del frame
    if "__module__" in namespace and "__qualname__" in namespace:
        namespace.setdefault("_fresh_process_fixtures", _FixturesInTheChild())

    # `functools.wraps` also copies `func.__dict__`: the markers of decorators placed below this one (`unittest.skip`,
    # `unittest.expectedFailure`, pytest marks) reach the runner of the parent, which applies them.
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if _in_fresh_process:
            return func(*args, **kwargs)
        __tracebackhide__ = True
        name = _test_name(func, args)
        request = _make_request(func, args, kwargs, name, seed=seed, num_threads=num_threads)
        _replay(_run_in_child(request, timeout, name), name, timeout)

    wrapper._fresh_process_body = func
    return wrapper


def _runs_in_fresh_process(test) -> bool:
    return getattr(test, "_fresh_process_body", None) is not None


class _FixturesInTheChild:
    """
    Put in the body of a class with decorated tests; when the class is created, wraps its fixtures so that, in the
    parent, `setUp` and `tearDown` are skipped for decorated tests, and `setUpClass` and `tearDownClass` when every test
    of the class is decorated. The child, which runs the test through `unittest`, runs them.
    """

    def __set_name__(self, owner, name):
        if not issubclass(owner, unittest.TestCase):  # a pytest-style class: pytest runs its fixtures
            return
        for fixture in ("setUp", "tearDown"):
            setattr(owner, fixture, self._per_test(getattr(owner, fixture)))
        for fixture in ("setUpClass", "tearDownClass"):
            function = getattr(getattr(owner, fixture), "__func__", None)
            if function is not None:  # a class method, as `unittest` expects
                setattr(owner, fixture, self._per_class(function))

    @staticmethod
    def _per_test(fixture):
        @functools.wraps(fixture)
        def guarded(self):
            if _in_fresh_process or not _runs_in_fresh_process(getattr(self, self._testMethodName, None)):
                fixture(self)

        return guarded

    @staticmethod
    def _per_class(fixture):
        @functools.wraps(fixture)
        def guarded(cls):
            names = unittest.defaultTestLoader.getTestCaseNames(cls)
            if _in_fresh_process or not all(_runs_in_fresh_process(getattr(cls, name)) for name in names):
                fixture(cls)

        return classmethod(guarded)


def _test_name(func, args):
    if args and isinstance(args[0], unittest.TestCase):
        return args[0].id()
    return f"{func.__module__}.{func.__qualname__}"


def _make_request(func, args, kwargs, name, **settings):
    """Describes the test so that the child can find it: by module and attribute names, not by pickling it."""
    testcase = args[0] if args and isinstance(args[0], unittest.TestCase) else None
    if testcase is None:
        module, scope, candidates = sys.modules[func.__module__], None, [func.__qualname__]
    else:  # `_testMethodName` is the name `parameterized.expand` generated, `__name__` the one in the class body
        module, scope, candidates = sys.modules[type(testcase).__module__], type(testcase), [testcase._testMethodName]
        candidates.append(func.__name__)
        args = args[1:]
    attribute = next((candidate for candidate in candidates if _find_body(scope or module, candidate) is func), None)
    if attribute is None:
        raise FreshProcessTestFailure(
            f"{name}: `run_test_in_fresh_process` cannot find {func.__qualname__} again in a new process: decorate a "
            "module-level function or a method of a `unittest.TestCase` (with `parameterized.expand` outermost)."
        )
    try:
        arguments = pickle.dumps((args, kwargs))
    except Exception as error:
        raise FreshProcessTestFailure(
            f"{name}: the arguments of the test cannot be sent to a new process, they cannot be pickled ({error!r}). "
            "Pass only picklable values (no pytest fixtures such as `caplog`, no mocks) or build them in the test."
        ) from error
    environ = isolated_environ()
    if _PER_TEST_VARIABLE in os.environ:
        environ[_PER_TEST_VARIABLE] = os.environ[_PER_TEST_VARIABLE]
    return {
        "module": (module.__name__, getattr(module, "__file__", None)),
        "testcase_class": scope.__qualname__ if scope is not None else None,
        "test_method": testcase._testMethodName if testcase is not None else None,
        "attribute": attribute,
        "arguments": arguments,
        "environ": environ,
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
        **settings,
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


# Messages between the parent and its server: a pickled tuple behind its length.
_HEADER = struct.Struct("!Q")


def _send(fd, message):
    data = pickle.dumps(message)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _receive(fd):
    """The next message, or `None` once the other side has closed the pipe."""
    header = _read_exactly(fd, _HEADER.size)
    data = None if header is None else _read_exactly(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


class _ServerDied(Exception):
    pass


class _Server:
    """
    The test server of this process, reached through two pipes that only this process holds: a copy of this process
    (`fork=True`) or a new interpreter (`subprocess`) running [`_serve_on`]. Used by one test at a time.
    """

    def __init__(self, fork=False):
        self.owner = os.getpid()
        self.forked = fork
        self.preloaded = _preloaded_count()
        self.started = False
        request_read, self.requests = os.pipe()
        self.responses, response_write = os.pipe()
        self.stderr = tempfile.TemporaryFile()
        try:
            if fork:
                self.process = self._fork(request_read, response_write)
            else:
                self.process = self._spawn(request_read, response_write)
        finally:
            os.close(request_read)
            os.close(response_write)

    def _spawn(self, request_read, response_write):
        command = [
            sys.executable,
            "-c",
            "from transformers.testing_isolation import _serve; _serve()",
            str(request_read),
            str(response_write),
        ]
        # A session of its own: a Ctrl-C in the terminal, or a test killing its process group, reaches the parent and
        # its child, not the server.
        return subprocess.Popen(
            command,
            env=isolated_environ(),
            pass_fds=(request_read, response_write),
            stdin=subprocess.DEVNULL,
            stdout=self.stderr,
            stderr=self.stderr,
            start_new_session=True,
        )

    def _fork(self, request_read, response_write):
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a process with threads may deadlock the child: the server runs no code of
            # the threads it leaves behind (torch's, pytest-xdist's), only imports and this module.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                os.close(self.requests)
                os.close(self.responses)
                _leave_the_parent(self.stderr.fileno())
                _serve_on(request_read, response_write)
            finally:
                os._exit(1)  # never back into the code of the parent
        return _ForkedProcess(pid)

    def start(self):
        """Has the server import and warm up, the first time; raises `RuntimeError` if it cannot."""
        if self.started:
            return
        try:
            _send(self.requests, ("start",))
            message = self.receive(_SERVER_STARTUP_TIMEOUT)
        except (OSError, _ServerDied):
            message = None
        if message is None or message[0] != "ready":
            detail = message[1] if message is not None and message[0] == "error" else self.output()
            self.close()
            raise RuntimeError(f"The test server did not start: {detail}")
        self.started = True

    def output(self):
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", errors="replace")

    def receive(self, timeout=None):
        """The next message from the server, `None` after `timeout` seconds; raises `_ServerDied` on end of file."""
        ready, _, _ = select.select([self.responses], [], [], timeout)
        if not ready:
            return None
        message = _receive(self.responses)
        if message is None:
            raise _ServerDied
        return message

    def death(self):
        """Describes how the server ended (waiting a little for it to be gone)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        code = self.process.returncode
        if code is None:
            return "closed its pipe"
        if code < 0:
            return f"was killed by signal {signal.Signals(-code).name}" + (
                " (out of memory?)" if code == -signal.SIGKILL else ""
            )
        return f"exited with code {code}"

    def run(self, request, timeout):
        """Runs one test; returns `(timed_out, exit code of the child)`. Raises `_ServerDied` if the server died."""
        try:
            _send(self.requests, ("run", request))
        except OSError:  # the server is gone
            raise _ServerDied from None
        deadline = time.monotonic() + timeout
        try:
            # The server says "started" once it forked the child, then "exited" with its exit code.
            message = ("started",)
            while message[0] != "exited":
                message = self.receive(max(deadline - time.monotonic(), 0))
                if message is None:
                    return True, self.kill_child()[2]
        except BaseException:  # interrupted (Ctrl-C, pytest-timeout): the child goes, the interruption goes on
            with contextlib.suppress(Exception):
                self.kill_child()
            raise
        return False, message[2]

    def kill_child(self):
        """Has the server kill the child's process group; returns the server's report of the child's end."""
        try:
            _send(self.requests, ("kill",))
            message = ("started",)
            while message is not None and message[0] != "exited":
                message = self.receive(_KILL_GRACE)
        except (OSError, _ServerDied):
            message = None
        if message is None:  # the server does not answer: it goes, and the child with it
            self.close()
            raise _ServerDied
        return message

    def close(self):
        with contextlib.suppress(OSError):
            os.close(self.requests)
        with contextlib.suppress(OSError):
            os.close(self.responses)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.stderr.close()


class _ForkedProcess:
    """The part of `subprocess.Popen` that `_Server` uses, for a server forked from this process."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by other code of this process: its exit status is lost
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"test server {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _preloaded_count():
    names = PRELOADED_MODULES + _OPTIONAL_PRELOADED_MODULES + _CPU_ONLY_PRELOADED_MODULES
    return sum(name in sys.modules for name in names)


def _can_fork_server():
    """
    Whether this process can be copied into the test server now: while pytest (8.2 or later, which sets
    `PYTEST_VERSION`) runs and no test does (`PYTEST_CURRENT_TEST`), that is while it imports the test modules; on
    Linux, from the main thread, and with a torch built for the CPU only. A CUDA, ROCm or XPU build may have started
    its driver (`transformers.testing_utils` looks for devices on import), which a forked process cannot use.

    Nor when the process has more threads than when this module was imported: a fork has only the thread that forked,
    and after an OpenMP parallel region (a large tensor operation at import time), a forked process would wait forever
    for the pool's threads in its next one.
    """
    if _in_fresh_process or "PYTEST_VERSION" not in os.environ or _PER_TEST_VARIABLE in os.environ:
        return False
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return False
    threads = _thread_count()
    if threads is None or _threads_at_import is None or threads > _threads_at_import:
        return False
    torch = sys.modules.get("torch")
    return torch is None or _built_for_cpu_only(torch)


def _built_for_cpu_only(torch):
    """Whether torch is built without CUDA, ROCm and XPU: nothing in this process can have started their drivers."""
    return all(getattr(torch.version, name, None) is None for name in ("cuda", "hip", "xpu"))


def _fork_server_while_collecting():
    """
    Called each time a test is decorated, which is while pytest imports the test modules: forks the test server from
    this process, so that the server starts with what the process has imported instead of importing it again. Forks
    again when a later test module has imported more of the modules the server preloads, as long as no test has used
    the server; never once a test runs (see [`_can_fork_server`]).
    """
    global _server
    if not _can_fork_server():
        return
    with _server_lock:
        if _server is not None and _server.owner == os.getpid():
            if _server.started or not _server.forked or _server.preloaded >= _preloaded_count():
                return
            _discard_server(_server)
        with contextlib.suppress(OSError):
            _server = _Server(fork=True)


def _get_server():
    global _server
    if _server is not None and (_server.owner != os.getpid() or _server.process.poll() is not None):
        # A server inherited through `fork` belongs to another process; a dead one is replaced.
        if _server.owner == os.getpid():
            _server.close()
        _server = None
    if _server is None:
        try:
            _server = _Server()
        except OSError as error:
            raise RuntimeError(f"The test server could not be started with {sys.executable}: {error}") from error
    try:
        _server.start()
    except RuntimeError as error:
        forked, _server = _server.forked, None
        if not forked:
            raise
        # Something in this process kept its copy from working: the tests still run, from a new interpreter.
        logger.warning(f"{error}; starting a new interpreter as the test server instead.")
        return _get_server()
    return _server


def _discard_server(server):
    global _server
    with contextlib.suppress(Exception):
        server.close()
    if _server is server:
        _server = None


def _run_in_child(request, timeout, name):
    """
    Runs the test in a child and returns `(result, timed_out, exit code, output)`; `result` is `None` if the child
    reported none.
    """
    if not hasattr(os, "fork"):
        raise unittest.SkipTest("`run_test_in_fresh_process` needs `os.fork`, which this platform does not have.")
    with _server_lock:
        # The server first: if this process is killed while the server starts, no workdir is left behind. Once the
        # server has the request, it removes the workdir if this process dies.
        try:
            server = _get_server()
        except RuntimeError as error:
            raise FreshProcessTestFailure(f"{name}: {error}") from None
        workdir = tempfile.mkdtemp(prefix="fresh_process_")
        try:
            # The child's temporary files go to the workdir, removed even when the child dies before its `tearDown`.
            tmpdir = os.path.join(workdir, "tmp")
            os.mkdir(tmpdir)
            request = {**request, "workdir": workdir, "environ": {**request["environ"], "TMPDIR": tmpdir}}
            open(os.path.join(workdir, _OUTPUT_FILE), "wb").close()  # exists even if the child dies before writing
            try:
                timed_out, exitcode = server.run(request, timeout)
            except _ServerDied:
                death = server.death()
                output = _read_output(workdir)
                _discard_server(server)
                raise FreshProcessTestFailure(
                    f"{name}: the test server (pid {server.process.pid}) {death} while running this test, which "
                    f"did not finish; the next test gets a new server.{_format_output(output)}"
                ) from None
            output = _read_output(workdir)
            result_path = os.path.join(workdir, _RESULT_FILE)
            result = None
            if os.path.exists(result_path):
                with open(result_path, "rb") as f:
                    result = pickle.load(f)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return result, timed_out, exitcode, output


def _read_output(workdir):
    with (
        contextlib.suppress(OSError),
        open(os.path.join(workdir, _OUTPUT_FILE), encoding="utf-8", errors="replace") as f,
    ):
        return f.read()
    return ""


def _replay(run, name, timeout):
    """Gives the parent the outcome of the child: return, or raise the matching exception."""
    __tracebackhide__ = True
    result, timed_out, exitcode, output = run
    if output:
        print(output, end="" if output.endswith("\n") else "\n")
    if timed_out:
        reason = f"timed out after {timeout} s (its process group was killed)"
    elif result is None and exitcode < 0:
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


# The server


def _serve():
    """Entry point of a new interpreter as server (`python -c`, arguments: the request and response pipes)."""
    _serve_on(int(sys.argv[1]), int(sys.argv[2]))


def _serve_on(requests, responses):
    """
    The server: waits for the parent to start it, imports and warms up, then forks one child per request and reports
    its end. Exits when the parent closes the requests.
    """
    # Interruptions are the parent's to handle: it asks for the child to be killed, or closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _receive(requests) is None:  # discarded before any test used it
        os._exit(0)
    try:
        _preload()
        _warm_up()
    except BaseException:
        _send(responses, ("error", traceback.format_exc()))
        os._exit(1)
    # Nothing the children inherit is garbage: the collector skips it, and the children do not copy its pages.
    import gc

    gc.collect()
    gc.freeze()
    _send(responses, ("ready",))
    while True:
        message = _receive(requests)
        if message is None:
            os._exit(0)
        if message[0] != "run":  # a late "kill" for a child already gone
            continue
        request = message[1]
        pid = os.fork()
        if pid == 0:
            os.close(requests)
            os.close(responses)
            _child_main(request, server=os.getppid())
        with contextlib.suppress(OSError):  # also done by the child: whichever runs first
            os.setpgid(pid, pid)
        _send(responses, ("started", pid))
        parent_gone = _wait_for_child(pid, requests)
        _, status = os.waitpid(pid, 0)
        if parent_gone:
            shutil.rmtree(request["workdir"], ignore_errors=True)
            os._exit(0)
        _send(responses, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _leave_the_parent(log_fd):
    """
    Turns a copy of the pytest process, right after the fork, into a server: a session of its own, its own standard
    streams, and none of what pytest set up for the collection (output capture, warning recording, log handlers,
    signal handlers, exception hooks). The modules being imported at the fork (the test module whose test was just
    decorated) are dropped, to be imported whole by the children.
    """
    import logging as std_logging

    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    sys.excepthook, sys.unraisablehook = sys.__excepthook__, sys.__unraisablehook__
    threading.excepthook = threading.__excepthook__
    warnings.showwarning = _show_warning
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
    root = std_logging.getLogger()
    for handler in list(root.handlers):
        if type(handler).__module__.startswith("_pytest."):
            root.removeHandler(handler)
    os.environ.clear()
    os.environ.update(isolated_environ())
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if frame.f_code.co_name == "<module>" and name != "__main__":
            sys.modules.pop(name, None)
        frame = frame.f_back


def _show_warning(message, category, filename, lineno, file=None, line=None):
    # What `warnings.showwarning` does in a new interpreter: pytest records the warnings of the collection instead.
    (sys.stderr if file is None else file).write(warnings.formatwarning(message, category, filename, lineno, line))


def _wait_for_child(pid, requests):
    """
    Waits until the child has exited, without reaping it, then kills what is left of its process group: until it is
    reaped, the child holds its id, which cannot be given to another process or group. Kills the group at once when
    the parent asks or is gone (end of file on the requests). Returns whether the parent is gone.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3, other systems: poll
        pidfd = None
    parent_gone = False
    try:
        while True:
            waited = [requests] if pidfd is None else [requests, pidfd]
            ready, _, _ = select.select(waited, [], [], 0.05 if pidfd is None else None)
            if requests in ready:
                message = _receive(requests)
                parent_gone = message is None
                if parent_gone or message[0] == "kill":
                    _kill_group(pid)
                if parent_gone:
                    break
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
    finally:
        if pidfd is not None:
            os.close(pidfd)
    _kill_group(pid)
    return parent_gone


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # the child has not made its group yet
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _preload():
    import importlib

    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    import torch

    optional = _OPTIONAL_PRELOADED_MODULES
    if _built_for_cpu_only(torch):
        optional = optional + _CPU_ONLY_PRELOADED_MODULES
    for name in optional:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _warm_up():
    """
    Runs, once in the server, the first calls that are slow in every new process: the first autocast fp16 forward and
    backward of the usual transformer kernels on CPU (embedding, layer norm, linear, attention, GELU, cross-entropy),
    the optimizers' steps (AdamW for-each and fused, SGD) with a `GradScaler`, gradient clipping, a `torch.save`,
    weights-only `torch.load` and safetensors round trip, and the checkpoint conversion mapping (a read-only cache).
    It leaves nothing a child could see: the random number generators are restored, the thread count is restored (the
    work runs on one thread, so that no OpenMP thread pool exists, which a forked child could not use), warnings shown
    are forgotten, the default dtype, the deterministic flags and the environment are untouched, and CUDA is not used.
    `tests/trainer/test_testing_isolation.py` checks this in the children.
    """
    import torch

    threads = torch.get_num_threads()
    environ = dict(os.environ)
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp_dir:
            warnings.simplefilter("ignore")
            _warm_up_kernels(torch, tmp_dir)
            _warm_up_transformers()
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)


def _warm_up_kernels(torch, tmp_dir):
    vocab_size, hidden_size, heads, length = 32, 16, 2, 8
    generator = torch.Generator().manual_seed(0)
    embedding = torch.nn.Embedding(vocab_size, hidden_size)
    layer_norm = torch.nn.LayerNorm(hidden_size)
    attention = torch.nn.Linear(hidden_size, 3 * hidden_size)
    head = torch.nn.Linear(hidden_size, vocab_size)
    parameters = [p for module in (embedding, layer_norm, attention, head) for p in module.parameters()]
    optimizers = [
        torch.optim.AdamW(parameters, foreach=False),
        torch.optim.AdamW(parameters, foreach=True),
        torch.optim.AdamW(parameters, fused=True),
        torch.optim.SGD(parameters),
    ]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for optimizer in optimizers:
        tokens = torch.randint(0, vocab_size, (2, length), generator=generator)
        with torch.autocast("cpu", dtype=torch.float16):
            hidden = layer_norm(embedding(tokens))
            query, key, value = attention(hidden).view(2, length, 3, heads, -1).permute(2, 0, 3, 1, 4)
            attended = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
            hidden = hidden + torch.nn.functional.gelu(
                attended.transpose(1, 2).reshape(hidden.shape), approximate="tanh"
            )
            logits = head(layer_norm(hidden))
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab_size), tokens.view(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    path = os.path.join(tmp_dir, "state.pt")
    torch.save({"optimizer": optimizers[1].state_dict(), "scaler": scaler.state_dict()}, path)
    torch.load(path, weights_only=True)
    with contextlib.suppress(ImportError):
        from safetensors.torch import load_file, save_file

        save_file(head.state_dict(), os.path.join(tmp_dir, "model.safetensors"))
        load_file(os.path.join(tmp_dir, "model.safetensors"))


def _warm_up_transformers():
    # Built on the first `save_pretrained` or `from_pretrained` of a process (about a thousand regular expressions),
    # then only read.
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    get_checkpoint_conversion_mapping("gpt2")


# The child


def _child_main(request, server):
    """Entry point of the child, right after the fork: runs the test, writes its outcome, and exits."""
    global _in_fresh_process
    _in_fresh_process = True
    try:
        os.setpgid(0, 0)
        _die_with(server)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _redirect_output(os.path.join(request["workdir"], _OUTPUT_FILE))
        faulthandler.enable()  # a crash shows where the test was, in its output
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
    finally:
        # No `atexit` handler nor `finally` of the server's own code may run in the child. The server kills what the
        # test left running in the group.
        os._exit(0)


def _die_with(server):
    """On Linux, asks the kernel to kill this child when the server dies; exits if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != server:
        os._exit(1)


def _redirect_output(path):
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run_test(request):
    os.environ.clear()
    os.environ.update(request["environ"])
    tempfile.tempdir = None  # read `TMPDIR` again
    sys.path[:] = request["sys_path"]
    os.chdir(request["cwd"])
    module = _import_module(*request["module"])
    args, kwargs = pickle.loads(request["arguments"])

    from transformers.trainer_utils import enable_full_determinism

    enable_full_determinism(request["seed"])
    os.environ.update(ISOLATION_ENV)
    if request["num_threads"] is not None:
        import torch

        torch.set_num_threads(request["num_threads"])

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

    if name == "__main__":  # a script: imported from its file, without running its `if __name__ == "__main__":` block
        name = "__fresh_process_main__"
    else:
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
