"""Texts that re-verify themselves (``fork.py check --tests``, so ``make check`` and ``make test``): every
reproduction in ``docs/pr`` and ``docs/issues`` is run on the pinned release and on the fork and must print what its
text shows, and ``read:`` evidence that quotes one of our upstreams at the pinned version must still find the quote.

A reproduction is a ```` ```python ```` block followed by the output it prints, each output block announced by a
marker line, an HTML comment that GitHub does not show, right above its fence::

    ```python
    # test_env_leak.py, run with `python -m pytest -q -s test_env_leak.py`
    ...
    ```

    <!-- output: stock -->
    ```
    a later subprocess sees _INSIDE_SUB_PROCESS, CI = 1 true
    ```

``stock`` is what it prints on the pinned releases (the sdists of ``patches/config.json``, unpacked; their ``src``
folders first on ``PYTHONPATH``), ``fork`` what it prints with the fix (the venv's editable installs of the forks, no
``PYTHONPATH``); a text may show one or both. The script is the nearest ```` ```python ```` block above the marker; a
``python`` block with no marker after it (a code sketch) is not run. Its first line may name the file and the
command, as above; otherwise it is ``repro.py``, run with ``python repro.py``; ``python`` is the venv's interpreter.
Each run has a new empty working folder and the environment of a reviewer's shell (``PATH``, ``HOME``, the locale and
a few more, nothing else of the caller's: no ``CI``, ``PYTEST_ADDOPTS`` or ``RUN_SLOW``), with ``HF_HUB_OFFLINE=1``,
``OMP_NUM_THREADS=1``, ``PYTHONUNBUFFERED=1`` (so stdout and stderr, read together, keep their order),
``TQDM_DISABLE=1`` (a progress bar on stderr would share a line with the next print), ``COLUMNS=80`` (pytest's summary
lines are cut at the terminal width) and ``REPRO_TIMEOUT`` seconds; the runs go in parallel, one per CPU core.

The one rule that compares a run with its text, for every text: **the lines the text shows appear in what the script
printed (stdout and stderr, split at ``\\n`` and ``\\r``), in the same order**; the other printed lines (the Trainer's
progress bars and metrics, warnings, pytest's headers) are left out. Both sides are normalised first: whitespace runs
become one space, blank lines are dropped, pytest's ``===`` banners, durations (``in 7.58s``, ``(0:01:05)``) and the
run's working folder (shown as ``.``) are removed. The exit status is not compared (a script may end in an exception
it shows); a run past the timeout is a problem. So a shown block says what is printed, never that a line is absent.
A text whose shown output no longer matches is named, with the first shown line that was not printed.

``read:`` evidence is re-checked when it names an upstream through its placeholder (texts.py) and quotes a line::

    read: huggingface/transformers@v{{transformers}} src/transformers/trainer.py:Trainer._load_scaler "scaler.pt"

that is ``read: [huggingface/]<upstream>@[v]{{<upstream>}} <path in the sdist>[:<function or Class.method>]
"<quoted text>"``, optionally followed by words without quotes. The quoted text (whitespace runs compared as one
space) must occur in that file of the pinned sdist, inside the named function when there is one. Other ``read:``
evidence is not re-checked; ``check`` counts it.
"""

import ast
import contextlib
import difflib
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .forks import venv_python
from .project import Project
from .sources import create_pristine, obtain_sdist
from .testenv import shell_environment
from .texts import claims_path, pinned_versions, render, upstream_texts


VARIANTS = ("stock", "fork")
REPRO_TIMEOUT = 300  # seconds per run
DEFAULT_FILE = "repro.py"
MARKER = re.compile(r"^<!--\s*output:\s*(\S+)\s*-->[ \t]*$")
FENCE_OPEN = re.compile(r"^(```|~~~)(\S*)\s*$")
COMMAND = re.compile(r"^#\s*(?P<file>[\w.-]+\.py), run with `(?P<command>[^`]+)`")
DURATION = re.compile(r"\s+in\s+\d+(?:\.\d+)?s\b(?:\s+\(\d+:\d\d:\d\d\))?")
BANNER = re.compile(r"^=+\s*|\s*=+$")
PINNED_READ = re.compile(
    r"^read: (?:huggingface/)?(?P<upstream>[\w-]+)@v?\{\{(?P=upstream)\}\} (?P<rest>.*)$", re.DOTALL
)
READ_SOURCE = re.compile(r'^(?P<path>[^\s:"]+)(?::(?P<function>[A-Za-z_][\w.]*))? "(?P<quote>.+)"[^"]*$', re.DOTALL)


@dataclass
class Output:
    variant: str
    lines: list[str]
    line: int  # of the marker, in the text


@dataclass
class Reproduction:
    text: Path
    line: int  # of the ```python fence
    script: str
    file: str
    command: list[str]
    outputs: list[Output]


def fences(lines: list[str]) -> list[tuple[int, int, str]]:
    """(first line, closing line, info string) of every fenced block, 0-based."""
    found, i = [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(1)), len(lines))
            found.append((i, end, m.group(2)))
            i = end
        i += 1
    return found


def reproductions(text: Path, body: str, where: str) -> tuple[list[Reproduction], list[str]]:
    """The reproductions of a text (``body``: rendered; ``where``: its name in problems) and what is wrong with its
    markers."""
    lines = body.splitlines()
    blocks, repros, problems = fences(lines), {}, []
    for n, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        variant = m.group(1)
        after = next((b for b in blocks if b[0] > n), None)
        script = next((b for b in reversed(blocks) if b[1] < n and b[2] == "python"), None)
        if variant not in VARIANTS:
            problems.append(f"{where}, line {n + 1}: output {variant!r} is none of {', '.join(VARIANTS)}")
        elif after is None or after[2] or any(s.strip() for s in lines[n + 1 : after[0]]):
            problems.append(f"{where}, line {n + 1}: the marker must stand right above a plain ``` block")
        elif script is None:
            problems.append(f"{where}, line {n + 1}: no ```python block above this output")
        else:
            shown = lines[after[0] + 1 : after[1]]
            repro = repros.get(script[0])
            if repro is None:
                code = "\n".join(lines[script[0] + 1 : script[1]]) + "\n"
                named = COMMAND.match(code)
                file, command = (
                    (named["file"], named["command"]) if named else (DEFAULT_FILE, f"python {DEFAULT_FILE}")
                )
                repro = repros[script[0]] = Reproduction(text, script[0] + 1, code, file, shlex.split(command), [])
                if repro.command[0] != "python":
                    problems.append(f"{where}, line {script[0] + 1}: its command must start with python: {command}")
            repro.outputs.append(Output(variant, shown, n + 1))
    return list(repros.values()), problems


def normalised(text: str, folder: Path | None = None) -> list[str]:
    """The non-blank lines of ``text`` as the comparison sees them (see the module's docstring)."""
    if folder is not None:
        for path in {str(folder.resolve()), str(folder)}:
            text = text.replace(path, ".")
    out = []
    for line in text.splitlines():
        line = " ".join(BANNER.sub("", DURATION.sub("", line)).split())
        if line:
            out.append(line)
    return out


def first_missing(shown: list[str], printed: list[str]) -> int | None:
    """The index of the first shown line not printed in order after the previous ones (None: all were)."""
    at = 0
    for i, line in enumerate(shown):
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            return i
    return None


# What a reviewer's own shell passes on (testenv.py). Nothing else of the caller's environment reaches a reproduction: a
# CI runner's ``CI=true`` both changes what the decorator's reproduction prints and makes pytest stop cutting summary
# lines, and ``make test`` exports ``RUN_SLOW`` and xdist its worker variables.


def run_script(
    repro: Reproduction, python: Path, pythonpath: list[Path], running: set | None = None
) -> tuple[str, int | None]:
    """Run a reproduction in a new folder: what it printed (normalised) and its exit status (None: past the
    timeout). Its process group is in ``running`` while it runs."""
    env = shell_environment()
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COLUMNS="80", TQDM_DISABLE="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    with tempfile.TemporaryDirectory(prefix="repro-") as tmp:
        folder = Path(tmp)
        (folder / repro.file).write_text(repro.script, encoding="utf-8")
        proc = subprocess.Popen(
            [str(python), *repro.command[1:]],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a timeout ends whatever it started
        )
        running = set() if running is None else running
        running.add(proc.pid)
        try:
            out, _ = proc.communicate(timeout=REPRO_TIMEOUT)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = None
        finally:
            running.discard(proc.pid)
        return "\n".join(normalised(out, folder)), status


def compare(
    project: Project, repro: Reproduction, output: Output, printed: str, status: int | None, label: str
) -> str | None:
    """The problem of one output block (None when the run printed what it shows)."""
    where = f"{project.rel(repro.text)}, line {output.line}"
    if status is None:
        return f"{where}: the reproduction ran past {REPRO_TIMEOUT} s on {label}"
    shown, lines = normalised("\n".join(output.lines)), printed.splitlines()
    missing = first_missing(shown, lines)
    if missing is None:
        return None
    close = difflib.get_close_matches(shown[missing], lines, n=1, cutoff=0.5)
    return (
        f"{where}: the reproduction no longer prints what the text shows on {label}: shown line {missing + 1}, "
        f"{shown[missing]!r}, is not printed (in that order)"
        + (f"; the closest printed line: {close[0]!r}" if close else "")
        + f"; exit status {status}, last printed: {' | '.join(lines[-3:]) or 'nothing'}"
    )


def pristine_sources(project: Project, tmp: Path, built: dict[str, Path]) -> dict[str, Path]:
    """Each upstream's pristine ``src`` folder: those ``check`` already unpacked (``built``), the others unpacked from
    the pinned sdist into ``tmp`` as ``check`` does."""
    sources = dict(built)
    for upstream in project.upstreams.values():
        if upstream.name not in sources:
            dest = tmp / f"stock-{upstream.name}"
            create_pristine(upstream, obtain_sdist(project, upstream), dest)
            sources[upstream.name] = dest / "src"
    return sources


def defined(source: str, name: str) -> str | None:
    """The source of function ``name`` (``f`` or ``Class.method``) in a module's ``source`` (None when absent)."""
    nodes, parts = ast.parse(source).body, name.split(".")
    for i, part in enumerate(parts):
        node = next(
            (
                n
                for n in nodes
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        if i == len(parts) - 1:
            return ast.get_source_segment(source, node)
        nodes = node.body
    return None


def read_problem(project: Project, where: str, evidence: str, sources: dict[str, Path]) -> str | None:
    """The problem of one re-checked ``read:`` evidence (None when its quote is where it says)."""
    m = PINNED_READ.match(evidence)
    source = READ_SOURCE.match(m["rest"])
    if m["upstream"] not in project.upstreams:
        return f"{where}: reads {m['upstream']}, which is none of the upstreams ({', '.join(project.upstreams)})"
    if source is None:
        return f'{where}: a read: at the pinned version must say <path>[:<function>] "<quoted text>"'
    version = project.upstreams[m["upstream"]].version
    path = sources[m["upstream"]].parent / source["path"]
    if not path.is_file():
        return f"{where}: {source['path']} is not in {m['upstream']} {version}"
    text = path.read_text(encoding="utf-8", errors="replace")
    if source["function"]:
        text = defined(text, source["function"]) if path.suffix == ".py" else None
        if text is None:
            return f"{where}: {source['path']} of {m['upstream']} {version} defines no {source['function']}"
    if " ".join(source["quote"].split()) not in " ".join(text.split()):
        inside = f", {source['function']}" if source["function"] else ""
        return f"{where}: {source['path']}{inside} of {m['upstream']} {version} does not say {source['quote']!r}"
    return None


def pinned_reads(project: Project) -> tuple[list[tuple[str, str]], int]:
    """(where, evidence) of each ``read:`` to re-check, and how many other ``read:`` evidence there are."""
    found, other = [], 0
    for text in upstream_texts(project):
        try:
            entries = json.loads(claims_path(text.path).read_text(encoding="utf-8"))["claims"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # texts.claims_problems reports it
        for i, entry in enumerate(entries if isinstance(entries, list) else [], 1):
            evidence = entry.get("evidence") if isinstance(entry, dict) else None
            if not isinstance(evidence, str) or not evidence.startswith("read: "):
                continue
            if PINNED_READ.match(evidence):
                found.append((f"{project.rel(claims_path(text.path))}, claim {i}", evidence))
            else:
                other += 1
    return found, other


def verify_texts(project: Project, tmp: Path, built: dict[str, Path]) -> tuple[list[str], str]:
    """Run every reproduction on the pinned releases and the fork, re-check every pinned ``read:``; returns the
    problems and the summary line for ``check``'s OK lines. ``built``: the pristine ``src`` folders ``check`` already
    unpacked, by upstream (the others are unpacked into ``tmp``)."""
    versions = pinned_versions(project)
    problems, repros = [], []
    for text in upstream_texts(project):
        body = render(text.path.read_text(encoding="utf-8"), versions)
        found, wrong = reproductions(text.path, body, project.rel(text.path))
        repros += found
        problems += wrong
    reads, other = pinned_reads(project)
    if not repros and not reads:
        return problems, f"OK: texts: no reproduction, no read: evidence at the pinned version ({other} other read:)"
    sources = pristine_sources(project, tmp, built)
    stock = f"the pinned {', '.join(u.label for u in project.upstreams.values())}"
    paths = {"stock": list(sources.values()), "fork": []}
    labels = {"stock": stock, "fork": "the fork"}
    runs = [(r, v) for r in repros for v in dict.fromkeys(o.variant for o in r.outputs)]
    python = venv_python(project)
    running = set()
    with ThreadPoolExecutor(max_workers=max(1, min(len(runs), os.cpu_count() or 1))) as pool:
        try:
            results = list(pool.map(lambda run: run_script(run[0], python, paths[run[1]], running), runs))
        except BaseException:  # Ctrl-C: the reproductions run in sessions of their own, which it does not reach
            pool.shutdown(wait=False, cancel_futures=True)
            for pid in list(running):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            raise
    for (repro, variant), (printed, status) in zip(runs, results):
        for output in repro.outputs:
            if output.variant == variant:
                problem = compare(project, repro, output, printed, status, labels[variant])
                if problem:
                    problems.append(problem)
    for where, evidence in reads:
        problem = read_problem(project, where, evidence, sources)
        if problem:
            problems.append(problem)
    texts = len({r.text for r in repros})
    return problems, (
        f"OK: texts: {len(repros)} reproduction(s) in {texts} text(s) print what they show ({len(runs)} run(s): "
        f"{sum(v == 'stock' for _, v in runs)} on {stock}, {sum(v == 'fork' for _, v in runs)} on the fork); "
        f"{len(reads)} read: quote(s) found in the pinned sources ({other} other read: evidence not re-checked)"
    )
