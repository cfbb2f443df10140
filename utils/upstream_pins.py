#!/usr/bin/env python3
"""Run the PRs' tests under upstream's own pytest pins and test plugins.

Upstream's ``setup.py`` pins pytest to a range (``pytest>=7.2.0,<9.0.0`` for 5.24.0 and 5.25.0) and its ``testing`` extra adds
pytest-xdist, pytest-random-order, pytest-rerunfailures, pytest-timeout and pytest-order. The main venv has the newest
pytest; this script runs the same tests a second time the way upstream's CI would:

1. read the specs of those packages from the built fork's ``setup.py`` (``_deps``), never a guess written here;
2. make ``build/upstream-pins`` once: a venv with only those packages (and their dependencies) installed, which then
   sees ``.venv``'s site-packages (torch, transformers, ...) *after* its own through a ``.pth`` file, so that its
   pytest and plugins win and torch is not installed twice. A stamp holds the specs: a re-run with the same specs
   installs nothing; changed specs rebuild the venv;
3. run ``pytest`` there on the given tests with random order on (``--random-order``), a pytest-timeout timeout and
   ``-n 2``, so that each plugin is active, in the environment of every test run of the workbench
   (``workbench/testenv.py``: a shell's basics and ``RUN_SLOW``/``OMP_NUM_THREADS``, none of the caller's other variables).

``--extra NAME`` also installs upstream's spec for NAME (e.g. ``deepspeed``, for the tests that need it) into the same
kind of venv, after it sees ``.venv``, with ``.venv``'s versions as constraints: nothing of ``.venv`` is replaced and
torch is never installed twice; use another ``--venv`` for it.

Usage: ``python utils/upstream_pins.py [--fork build/transformers] [--venv build/upstream-pins] [pytest args...]``.
Exit status: pytest's, or 2 with a message on a setup error.
"""

import argparse
import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.args import Parser
from workbench.project import load_project
from workbench.stack import load_stack
from workbench.testenv import clean_test_env


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pytest", "pytest-xdist", "pytest-random-order", "pytest-rerunfailures", "pytest-timeout", "pytest-order")
DEFAULT_PYTEST_ARGS = ("-n", "2", "--random-order", "--timeout", "900", "-p", "no:cacheprovider")
STAMP = "upstream-pins.json"


def stack_tests() -> list[str]:
    """The tests of the stack's transformers PRs (the ones this venv's transformers fork holds)."""
    return [test for pr in load_stack(load_project(ROOT)) if pr.upstream == "transformers" for test in pr.tests]


class PinsError(Exception):
    pass


def upstream_specs(setup_py: Path, packages=PACKAGES) -> list[str]:
    """The requirement strings of `packages` in the `_deps` list of upstream's `setup.py`."""
    if not setup_py.is_file():
        raise PinsError(f"{setup_py} does not exist: run `make fork` first.")
    tree = ast.parse(setup_py.read_text(encoding="utf-8"), str(setup_py))
    deps = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_deps" for t in node.targets):
            deps = ast.literal_eval(node.value)
    if deps is None:
        raise PinsError(f"{setup_py} has no `_deps` list: upstream changed how it pins its dependencies.")
    specs = {}
    for spec in deps:
        name = spec.split(";")[0]
        for operator in "<>=!~ [":
            name = name.split(operator)[0]
        specs[name.strip().lower()] = spec
    missing = [name for name in packages if name not in specs]
    if missing:
        raise PinsError(f"{setup_py} does not pin {', '.join(missing)} in `_deps` any more.")
    return [specs[name] for name in packages]


def site_packages(python: Path) -> Path:
    command = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    return Path(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())


def ensure_venv(venv: Path, specs: list[str], base_python: Path, extras: list[str] = ()) -> Path:
    """Creates (or reuses) the venv; returns its python."""
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    wanted = {"specs": specs, "base": str(base_python)}
    if extras:
        wanted["extras"] = list(extras)
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == wanted and python.exists():
        return python
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Installed before the venv sees the main one, so that pip never touches (uninstalls) a package of `.venv`.
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs]
    if subprocess.run(install).returncode != 0:
        raise PinsError(f"pip could not install {' '.join(specs)} into {venv}.")
    line = f"import site; site.addsitedir({str(site_packages(base_python))!r})\n"
    (site_packages(python) / "zz_main_venv.pth").write_text(line, encoding="utf-8")
    if extras:
        # Installed once the venv sees the main one, so that what it has (torch above all) satisfies their needs;
        # the main venv's versions are constraints, so pip can never replace (uninstall) one of its packages.
        frozen = subprocess.run(
            [str(base_python), "-m", "pip", "list", "--disable-pip-version-check", "--format", "freeze"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        constraints = venv / "main-venv-constraints.txt"
        constraints.write_text(frozen, encoding="utf-8")
        install = [*install[: -len(specs)], "--constraint", str(constraints), *extras]
        if subprocess.run(install).returncode != 0:
            raise PinsError(f"pip could not install {' '.join(extras)} into {venv} next to {base_python}'s packages.")
    stamp.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")
    return python


def main(argv=None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fork", type=Path, default=ROOT / "build" / "transformers", help="the built fork")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "upstream-pins", help="the venv to make")
    parser.add_argument("--base-python", type=Path, default=ROOT / ".venv" / "bin" / "python", help="the main venv")
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        help="also install this package at upstream's spec (e.g. deepspeed), next to the main venv's packages",
    )
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (default: the tests of the PRs)")
    args = parser.parse_args(argv)
    try:
        specs = upstream_specs(args.fork / "setup.py")
        if not args.base_python.exists():
            raise PinsError(f"{args.base_python} does not exist: run `make fork` first.")
        extras = upstream_specs(args.fork / "setup.py", args.extra) if args.extra else []
        python = ensure_venv(args.venv, specs, args.base_python, extras)
    except (PinsError, subprocess.CalledProcessError) as error:
        print(f"upstream_pins: {error}", file=sys.stderr)
        return 2
    versions = subprocess.run(
        [str(python), "-m", "pip", "list", "--disable-pip-version-check", "--format", "freeze"],
        capture_output=True,
        text=True,
    ).stdout
    names = {*PACKAGES, *args.extra}
    installed = [line for line in versions.splitlines() if line.split("==")[0].lower() in names]
    print(f"upstream_pins: {', '.join(specs + extras)} -> {', '.join(installed)}", flush=True)
    pytest_args = args.pytest_args or [*DEFAULT_PYTEST_ARGS, *stack_tests()]
    # In a defined environment (workbench/testenv.py), not the caller's
    return subprocess.run([str(python), "-m", "pytest", *pytest_args], cwd=ROOT, env=clean_test_env()).returncode


if __name__ == "__main__":
    sys.exit(main())
