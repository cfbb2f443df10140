"""Tests for the Makefile's interface (make help, the variables that pass options, what reaches a command's
environment) and for the environment every test run of the workbench starts in (utils/workbench/testenv.py)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

# The variables of the Makefile's interface (`make help` names them)
INTERFACE = (
    "PYTHON",
    "FORK_ARGS",
    "PYTEST_ARGS",
    "REPRO_ARGS",
    "UPGRADE_ARGS",
    "AUTHOR",
    "TRANSFORMERS",
    "ACCELERATE",
)


def make(*args: str, makefiles=()) -> str:
    """``make -s ARGS`` in the repository, as from a shell of one's own (no make of ours around it); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    files = [arg for path in makefiles for arg in ("-f", str(path))]
    command = ["make", "-s", *(["-f", "Makefile"] if files else []), *files, *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout


def targets() -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    return sorted({m.group(1) for m in re.finditer(r"^([a-z][a-z-]*):(?!=)", text, flags=re.MULTILINE)})


def test_make_help_lists_every_target_one_line_each():
    printed = make("help")
    assert set(targets()) >= {"help", "fork", "test", "check", "patches", "pr", "repro", "upgrade", "quality"}
    for target in targets():
        lines = [line for line in printed.splitlines() if re.match(rf"  {re.escape(target)} +\S", line)]
        assert len(lines) == 1, f"make help shows {target} on {len(lines)} lines:\n{printed}"
    for variable in ("REPRO_ARGS", "UPGRADE_ARGS", "AUTHOR", "TRANSFORMERS", "FORK_ARGS"):
        assert variable in printed
    assert make() == printed  # bare `make` is `make help`, and builds nothing


def test_the_examples_make_help_gives_are_taken():
    """make help's example REPRO_ARGS ('--steps 6 ...') was refused by utils/repro: its checkpoint to resume from
    stayed 11. Each example is parsed by the command it goes to."""
    printed = " ".join(make("help").split())
    example = re.search(r"REPRO_ARGS \(utils/repro, e\.g\. '([^']+)'\)", printed).group(1)
    from repro import cli as repro_cli

    assert repro_cli.parse_args(shlex.split(example)).steps == 6
    from workbench import cli as fork_cli

    for option in re.search(r"OPEN_ARGS \(open, e\.g\. ([^)]+)\)", printed).group(1).split(", "):
        args = fork_cli.parse_args(
            ["open", "--clone", "x", *option.replace("REF", "main").replace("DIR", "d").split()]
        )
        assert args.command == "open"


def test_make_passes_the_options_it_names():
    recipe = make("-n", "repro", "REPRO_ARGS=--steps 6 --scenarios no_scaler_pt").splitlines()[-1]
    assert shlex.split(recipe) == [".venv/bin/python", "utils/repro", "--steps", "6", "--scenarios", "no_scaler_pt"]
    recipe = make("-n", "pr", "AUTHOR=Jane O'Doe <jane@example.invalid>").splitlines()[-1]
    assert shlex.split(recipe)[-2:] == ["--author", "Jane O'Doe <jane@example.invalid>"]
    printed = make("-n", "upgrade", "TRANSFORMERS=5.25.0", "UPGRADE_ARGS=--allow-older --force")
    recipe = printed[printed.index(".venv/bin/python utils/fork.py upgrade") :]
    recipe = shlex.split(recipe.replace("\\\n", " "))  # the recipe's continued line
    assert recipe[3:] == ["--transformers", "5.25.0", "--pytest-args=-n auto", "--allow-older", "--force"]


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        (  # an option of pytest's, passed on whole (`--pytest-args --bogus` was argparse's "expected one argument")
            ["utils/fork.py", "check", "--pytest-args=--bogus-opt"],
            "fork.py check: error: argument --pytest-args: pytest refuses '--bogus-opt': unrecognized arguments: "
            "--bogus-opt (--help: the usage)",
        ),
        (
            ["utils/testrun.py", "--pytest-args=-n"],
            "testrun.py: error: argument --pytest-args: pytest refuses '-n': argument -n/--numprocesses: expected "
            "one argument (--help: the usage)",
        ),
        (["utils/fork.py", "bogus"], "fork.py: error: argument command: invalid choice: 'bogus' (choose from"),
        (["utils/testrun.py", "--only", "9"], "testrun.py: error: argument --only: invalid choice: 9 (choose from 1,"),
        (["utils/fork.py", "pr", "--author", "me"], "fork.py pr: error: --author 'me' must look like 'Name <email>'"),
        (
            ["utils/repro", "--steps", "x"],
            "repro: error: argument --steps: invalid int value: 'x' (--help: the usage)",
        ),
        (["utils/census.py"], "census.py: error: the following arguments are required: tests (--help: the usage)"),
        (  # pytest's own refusal, after the run: options of the tree's conftest.py are the tree's to take
            ["utils/census.py", "tests/workbench/test_census.py", "--", "--bogus"],
            "census: pytest refuses '--bogus': unrecognized arguments: --bogus",
        ),
        (["utils/resume_diff.py", "a"], "resume_diff.py: error: the following arguments are required: b (--help"),
        (
            ["bench/gpu_check.py", "--bogus"],
            "gpu_check.py: error: unrecognized arguments: --bogus (--help: the usage)",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(command, refusal):
    """The commands the README shows refuse bad input in one line (argparse printed its whole usage first), status 2;
    pytest's options are checked by pytest before anything is built."""
    proc = subprocess.run([sys.executable, *command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, len(proc.stderr.splitlines())) == (2, "", 1), proc.stderr
    assert proc.stderr.startswith(refusal)


def test_pytest_options_that_pytest_takes_are_passed_on_unchanged():
    from workbench.testenv import pytest_options

    for value in ("", "-n 2", "-k 'resume and not slow' --timeout 900", "-p no:randomly -x"):
        assert pytest_options(value) == value


def test_ctrl_c_while_pytest_checks_the_options_is_one_line(monkeypatch, capsys):
    """The check runs pytest (about 1 s) while the command parses its arguments, before its own Ctrl-C handling: a
    Ctrl-C then printed a traceback."""
    from workbench import testenv

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(testenv.subprocess, "run", interrupted)
    monkeypatch.setattr(sys, "argv", ["fork.py"])
    with pytest.raises(SystemExit) as stopped:
        testenv.pytest_options("-n 2")
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "\nfork.py: interrupted while reading its arguments; nothing was done.\n"


def test_scripts_are_told_the_command_that_keeps_make_repros_statuses():
    """make turns every failure into 2: the README gives scripts the command `make repro` runs, with its statuses
    (tested in test_repro_cli.py: 1 not fixed, 2 bad input, 130 Ctrl-C)."""
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    recipe = make("-n", "repro").splitlines()[-1].strip()
    assert f"scripts run `{recipe} [options]` (what `make repro` runs" in readme
    assert "0 the fork behaves as fixed, 1 it does not, 2 bad input or setup, 130 Ctrl-C" in readme


def test_no_variable_of_the_interface_reaches_a_command(tmp_path):
    """make puts its command line's variables into each recipe's environment: `ACCELERATE=1.16.0` reached the tests,
    whose upstream helpers delete every variable named like it, and the global-state plugin failed them."""
    extra = tmp_path / "print-env.mk"
    extra.write_text("print-env:\n\t@env\n", encoding="utf-8")
    assignments = [f"{name}=x" for name in INTERFACE]
    names = {line.partition("=")[0] for line in make("print-env", *assignments, makefiles=[extra]).splitlines()}
    assert names.isdisjoint(INTERFACE), sorted(names & set(INTERFACE))


def test_a_test_run_gets_a_defined_environment(tmp_path):
    from workbench.testenv import clean_test_env

    caller = {
        "PATH": "/bin",
        "HOME": "/home/me",
        "LC_ALL": "C.UTF-8",
        "RUN_SLOW": "1",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE": "1.16.0",  # make's command line
        "MAKEFLAGS": "s -- ACCELERATE=1.16.0",
        "ACCELERATE_MIXED_PRECISION": "bf16",  # a user's own setting
        "TRANSFORMERS_VERBOSITY": "debug",
        "CI": "true",
        "PYTEST_ADDOPTS": "-x",
        "PYTHONPATH": "/elsewhere",
    }
    assert clean_test_env(caller, PYTHONPATH="utils") == {
        "PATH": "/bin",
        "HOME": "/home/me",
        "LC_ALL": "C.UTF-8",
        "RUN_SLOW": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "utils",
    }
    # `make test` runs its pytest through it: a test sees none of the caller's other variables
    test = tmp_path / "test_sees.py"
    test.write_text(
        "import os\n\n\ndef test_sees():\n"
        "    assert [k for k in os.environ if 'ACCELERATE' in k or k in ('CI', 'MAKEFLAGS')] == []\n"
        "    assert os.environ['RUN_SLOW'] == '1'\n",
        encoding="utf-8",
    )
    env = {**os.environ, **{k: v for k, v in caller.items() if k not in ("PATH", "HOME", "PYTHONPATH")}}
    env["PYTHONPATH"] = str(REPO_ROOT / "utils")
    command = [sys.executable, "-m", "workbench.testenv", "-q", "-p", "no:cacheprovider", "-p", "pytest_global_state"]
    proc = subprocess.run([*command, str(test)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_gives_the_command_make_clone_venv_runs():
    """As for `make repro` and `make open`: scripts run what make runs, which keeps the exit statuses."""
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    recipe = shlex.split(make("-n", "clone-venv", "CLONE=../transformers").splitlines()[-1])
    assert " ".join(recipe) == ".venv/bin/python utils/fork.py clone-venv --clone ../transformers --out ../clone-venv"
    assert f"scripts run the command make runs, which keeps them: `{' '.join(recipe)}`" in readme
    assert "`make clone-venv CLONE=../transformers` (`CLONE_VENV=DIR`, default `../clone-venv`" in readme
