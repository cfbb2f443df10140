"""The environment every test run of the workbench starts pytest in: defined here, never the caller's whole one.

What a shell, a CI runner or make hands a process can change what tests do. make puts the variables of its command
line into its recipes' environment (``make upgrade ACCELERATE=1.16.0`` hands every recipe ``ACCELERATE``, and
upstream's test helpers delete each variable whose name contains ``ACCELERATE``, which the global-state plugin then
reports as the test's doing), a CI runner sets ``CI``, and a user may have ``PYTEST_ADDOPTS``, ``PYTHONPATH`` or an
``ACCELERATE_*``/``TRANSFORMERS_*`` setting exported. A test run gets the basics of a shell and the knobs the workbench
sets on purpose (``make test`` exports ``RUN_SLOW`` and ``OMP_NUM_THREADS``; a GPU is chosen with
``CUDA_VISIBLE_DEVICES``), and nothing else.

``make test`` runs its own tests through this module:
``python -m workbench.testenv [pytest args]`` runs ``python -m pytest [pytest args]`` in that environment with
``PYTHONPATH=utils`` (for the ``pytest_global_state`` plugin) and exits with pytest's status.
"""

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


# What a user's own shell passes on (a reproduction in a reviewer's shell gets these too, repros.py).
SHELL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TMPDIR")
# The knobs a test run takes from its caller.
TEST_KNOBS = ("RUN_SLOW", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
UTILS = Path(__file__).resolve().parent.parent
PYTEST_USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR (pytest is not imported here)


def shell_environment(environ=None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) that a shell of one's own passes on: ``SHELL_ENV`` and
    the locale (``LC_*``)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in SHELL_ENV or k.startswith("LC_")}


def clean_test_env(environ=None, **settings: str) -> dict[str, str]:
    """The environment of a test run: ``shell_environment`` and ``TEST_KNOBS`` of ``environ``, then ``settings``."""
    environ = os.environ if environ is None else environ
    env = shell_environment(environ)
    env.update({k: environ[k] for k in TEST_KNOBS if k in environ})
    env.update(settings)
    return env


def run_tests(cmd: list[str], capture: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)`` (``capture``: its output as text) in a session of its own: Ctrl-C does not
    reach the test run (pytest-xdist prints a traceback when it lands while its workers stop); on Ctrl-C this process
    stops it, its workers included, and re-raises."""
    if capture:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate()
    except KeyboardInterrupt:
        with sigint_ignored():  # a second Ctrl-C does not cut the stopping short
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):  # what outlived it (a child that handles SIGTERM)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextlib.contextmanager
def sigint_ignored():
    """SIGINT (Ctrl-C) ignored in this process for the block, while it stops what it started."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pytest_refusal(value: str, python: str = sys.executable, conftest: Path | None = None) -> str | None:
    """pytest's own refusal of the options ``value`` (one string, split as a shell does: an unknown option, a missing
    value), or None: ``python``'s pytest (its plugins) collects an empty folder with them, holding a copy of
    ``conftest`` where given (a clone's root ``conftest.py`` adds options of its own; its side effects stay there)."""
    if not value.strip():
        return None
    with tempfile.TemporaryDirectory(prefix="pytest-options-") as empty:
        if conftest is not None and conftest.is_file():
            shutil.copyfile(conftest, os.path.join(empty, "conftest.py"))
        cmd = [python, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider", *shlex.split(value)]
        cmd += ["--collect-only", "-q", f"--rootdir={empty}", empty]
        env = clean_test_env(PYTHONPATH=str(UTILS))
        try:
            proc = subprocess.run(cmd, cwd=empty, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        except KeyboardInterrupt:  # Ctrl-C while the command reads its arguments: it has done nothing yet
            print(
                f"\n{os.path.basename(sys.argv[0])}: interrupted while reading its arguments; nothing was done.",
                file=sys.stderr,
            )
            raise SystemExit(130) from None
    refusal = usage_error(proc.returncode, proc.stderr)
    return f"pytest refuses {value!r}: {refusal}" if refusal else None


def usage_error(returncode: int, output: str) -> str | None:
    """What pytest's usage error says (``unrecognized arguments: --bogus``), when ``returncode`` is one."""
    refusals = [line.partition(": error: ")[2] for line in output.splitlines() if ": error: " in line]
    return refusals[0] if returncode == PYTEST_USAGE_ERROR and refusals else None


def pytest_options(value: str) -> str:
    """``value`` when this venv's pytest takes it (argparse's ``type``): the refusal is the error, before any level or
    test is built."""
    refusal = pytest_refusal(value)
    if refusal:
        raise argparse.ArgumentTypeError(refusal)
    return value


def main(argv: list[str]) -> int:
    env = clean_test_env(PYTHONPATH=str(UTILS))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "pytest", *argv], env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
