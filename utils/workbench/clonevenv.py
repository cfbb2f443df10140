"""``clone-venv`` (``make clone-venv CLONE=../transformers``): a virtual environment that runs a contributor's clone's
own tests, for ``make open`` (``OPEN_ARGS="--venv ../clone-venv"``) where the clone's main is newer than the pinned
release and its tests do not import with the workbench's venv.

It makes the venv with the workbench venv's Python; installs torch pinned as ``make deps`` does (``patches/config.json``);
the clone editable without its dependencies (``pip install --no-deps -e CLONE``); then, in one pip run, the
requirements the clone declares in its own metadata (read in the new venv: the core ones and its ``testing`` extra) and
the tools ``open`` runs (pytest, pytest-xdist, pytest-timeout) where the clone names none of them and the venv lacks
them (pinned as here). torch stays at its pin (a constraint). A requirement no release on the package index satisfies
(pip's "No matching distribution found for X") is left out and pip runs again without it, as is one whose own dependency
none satisfies (pip names it "from" that requirement); each is named. Then ``open``'s collection of upstream's suite
(``tests/trainer``, opener.collection) runs in the clone with the new venv, and one line says the venv, the tests
collected and the requirements left out.

``--out`` must not exist, or be an empty folder, or a venv this command made (its marker file is in it: the command goes
on there, pip installing what is missing); nothing else is overwritten. Exit status 0 when the suite collects, 1 when
it does not (each file's error, the ``ImportError`` line) or pip fails otherwise, 2 on bad input (one line, nothing
made), 130 on Ctrl-C (cli.py).
"""

import dataclasses
import json
import re
import subprocess
import tempfile
from pathlib import Path

from .forks import requirement_name, venv_python
from .gitutil import BadInput, ForkError
from .opener import SUITES, check_clone, clone_upstream, collection, not_collected
from .project import Project


MARKER = ".workbench-clone-venv.json"  # in a venv this command made
EXTRA = "testing"  # the extra that holds upstream's test dependencies
OPEN_TOOLS = ("pytest", "pytest-xdist", "pytest-timeout")  # what `open` runs: pytest, its -n, README's --timeout
NO_RELEASE = re.compile(r"No matching distribution found for (\S+)")
NEEDED_BY = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from ([^)]+)\)")

# Run by the new venv's Python: the clone's declared requirements (core, and the EXTRA's), each without its marker,
# and which of OPEN_TOOLS it has installed. pip's own copy of `packaging` evaluates the markers.
REQUIREMENTS_CODE = """
import importlib.metadata as m, json, sys
from pip._vendor.packaging.requirements import Requirement
package, extra, tools = sys.argv[1], sys.argv[2], sys.argv[3:]
core, extras = [], []
for text in m.requires(package) or []:
    r = Requirement(text)
    base = r.marker is None or r.marker.evaluate({"extra": ""})
    wanted = base or r.marker.evaluate({"extra": extra})
    r.marker = None
    if wanted:
        (core if base else extras).append(str(r))
installed = []
for tool in tools:
    try:
        m.version(tool)
        installed.append(tool)
    except m.PackageNotFoundError:
        pass
print(json.dumps([core, extras, installed]))
"""


def check_out(out: Path) -> bool:
    """Whether ``out`` is a venv this command made (True), or free to make one in (False); else BadInput."""
    if (out / MARKER).is_file():
        return True
    if (out.is_dir() and not any(out.iterdir())) or not (out.exists() or out.is_symlink()):
        return False
    raise BadInput(f"--out {out} exists and is not an empty folder or a venv made by clone-venv: name another")


def pip(python: Path, *args: str) -> tuple[int, str]:
    """``python -m pip install ARGS``, its output shown as it comes; (status, output)."""
    cmd = [str(python), "-m", "pip", "install", *args]
    print("+ " + " ".join(cmd), flush=True)
    lines = []
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    ) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    return proc.returncode, "".join(lines)


def unavailable(output: str, todo: list[str]) -> tuple[str, str] | None:
    """The requirement of ``todo`` that pip's ``output`` says no release on the index satisfies, or whose dependency none
    satisfies: (requirement, how it is named in the summary); None where pip failed otherwise."""
    match = NO_RELEASE.search(output)
    if not match:
        return None
    missing = match.group(1)
    ours = {requirement_name(r): r for r in todo}
    if requirement_name(missing) in ours:
        return ours[requirement_name(missing)], ours[requirement_name(missing)]
    for wanted, parent in NEEDED_BY.findall(output):
        if requirement_name(wanted) == requirement_name(missing) and requirement_name(parent) in ours:
            parent = ours[requirement_name(parent)]
            return parent, f"{parent} (needs {missing})"
    return None


def install_available(python: Path, requirements: list[str], constraints: Path) -> list[str]:
    """``pip install`` the requirements; each the index cannot provide is left out and pip runs again without it (at
    most once per requirement). Returns those left out, as the summary names them; ForkError where pip fails
    otherwise."""
    todo, left_out = list(requirements), []
    while todo:
        status, output = pip(python, "-c", str(constraints), *todo)
        if status == 0:
            break
        found = unavailable(output, todo)
        if found is None:
            errors = [line for line in output.splitlines() if line.startswith("ERROR")][-4:]
            raise ForkError("pip install failed:\n  " + "\n  ".join(errors or output.splitlines()[-4:]))
        todo.remove(found[0])
        left_out.append(found[1])
        print(f"(no release on the package index satisfies {found[1]}: installing the rest without it)", flush=True)
    return left_out


def cmd_clone_venv(project: Project, args) -> int:
    clone = check_clone(project, args.clone)
    upstream = clone_upstream(project, clone, args.upstream)
    if not (clone / "pyproject.toml").is_file() and not (clone / "setup.py").is_file():
        raise BadInput(f"{clone} has no setup.py or pyproject.toml: pip cannot install it")
    suite = args.suite or SUITES.get(upstream.name, ["tests"])
    missing = [rel for rel in suite if not (clone / rel).exists()]
    if missing:
        raise BadInput(f"{clone} has no {', '.join(missing)} (upstream's tests to collect): pass --suite PATH")
    if not venv_python(project).exists():
        raise BadInput(f"no virtual environment at {project.rel(project.venv)}: run `make fork` first")
    out = Path(args.out).absolute()
    if out == project.venv.absolute():
        raise BadInput(f"--out {out} is the workbench's own venv: name another")
    ours = check_out(out)
    python = out / "bin" / "python"
    out.mkdir(parents=True, exist_ok=True)  # marked first: a run stopped inside `venv` is this command's to go on with
    (out / MARKER).write_text(json.dumps({"clone": str(clone)}) + "\n", encoding="utf-8")
    if not python.exists() and subprocess.run([str(venv_python(project)), "-m", "venv", str(out)]).returncode != 0:
        raise ForkError(f"{venv_python(project)} -m venv {out} failed (its output is above)")
    print(f"clone-venv: {'going on in' if ours else 'made'} {out} for {clone}", flush=True)
    torch = project.pins.get("torch")
    with tempfile.TemporaryDirectory(prefix="workbench-clone-venv-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={torch}\n" if torch else "", encoding="utf-8")
        steps = ([[f"torch=={torch}"]] if torch else []) + [["--no-deps", "-e", str(clone)]]  # torch first, as deps
        for step in steps:
            if pip(python, "-c", str(constraints), *step)[0] != 0:
                raise ForkError(f"pip install {' '.join(step)} failed in {out} (its output is above)")
        proc = subprocess.run(
            [str(python), "-c", REQUIREMENTS_CODE, upstream.package, EXTRA, *OPEN_TOOLS],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ForkError(f"could not read {upstream.package}'s requirements in {out}: {proc.stderr.strip()}")
        core, extras, installed = json.loads(proc.stdout)
        requirements = list(dict.fromkeys(core + extras))
        named = {requirement_name(r) for r in requirements}
        tools = [t for t in OPEN_TOOLS if t not in named and t not in installed]
        requirements += [f"{t}=={project.pins[t]}" if t in project.pins else t for t in tools]
        print(
            f"clone-venv: {len(core)} core requirement(s) of {upstream.package}, {len(extras)} of its {EXTRA!r} "
            f"extra" + (f", and {', '.join(tools)} (what `open` runs)" if tools else ""),
            flush=True,
        )
        left_out = install_available(python, requirements, constraints)
        run = collection(dataclasses.replace(project, venv=out), upstream, clone, suite, Path(tmp))
    left = "nothing left out"
    if left_out:
        left = f"left out (no release on the package index satisfies them): {', '.join(left_out)}"
    if run.collect_errors or not run.collected:
        raise ForkError(f"{out}: upstream's {' '.join(suite)} does not collect with it: {not_collected(run)}; {left}")
    print(f"clone-venv: {out}: {run.collected} tests of {' '.join(suite)} collected; {left}", flush=True)
    return 0
