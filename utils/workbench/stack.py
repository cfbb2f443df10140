"""The PR stack: ``patches/stack.json`` lists the PRs in review order (bottom first), each in one upstream.

A PR owns overlay files and patches of its upstream. Its *level* is the pristine sdist plus the PRs it depends on
(``depends_on``, directly or through others) plus itself: each PR's overlay files committed first, then its patches
with ``git am``. A PR that depends on nothing stands alone on the pristine base. The fork holds every PR, in stack
order, so the series must also apply one PR after the other. ``check`` builds both in a scratch repository (one per
upstream: the whole stack at HEAD, one tag ``level/<name>`` per PR, ``deps/<name>`` for its dependencies alone) and runs
each PR's own tests at its level, from a checkout of that level with ``PYTHONPATH=<level>/src`` so that it, and not the
editable fork, is imported, in the environment of every test run (testenv.py: none of the caller's other variables); then once more without the PR's fix (its changes outside ``tests/`` undone, or, for a PR of
regression tests only, its ``mutation`` applied), where they must fail.
"""

import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from .gitutil import ForkError, PatchConflict, git, ls_tree
from .junit_report import test_cases
from .overlay import add_overlay, read_overlay, repo_path, under_roots
from .project import Project, Upstream, read_json
from .series import apply_patches, read_series
from .sources import BASE_REF, create_pristine, obtain_sdist
from .testenv import clean_test_env, run_tests


# The workbench's pytest plugins (``pytest_global_state``) live in ``utils/``.
UTILS = Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
LEVEL_TAG = "level/"
DEPS_TAG = "deps/"


@dataclass
class PR:
    name: str
    upstream: str
    title: str
    position: int  # 1-based, in the whole stack
    patches: list[str] = field(default_factory=list)
    overlay: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    description: str = ""
    depends_on: list[str] = field(default_factory=list)
    overlay_message: str = ""
    # The issue draft (docs/issues/*.md) the submitter opens before this PR, where upstream wants one first.
    issue_first: str = ""
    # For a PR that only adds tests which pass on the pristine base (a regression test): ``[file, old, new]``, one
    # replacement in the level's library code that must make its tests fail (what they guard).
    mutation: list[str] = field(default_factory=list)
    # An edit to an existing upstream test file that the sdist lacks (its tests/ tree): a patch file of this repository
    # for the submitter's clone of upstream main, shipped beside the series.
    upstream_test_patch: str = ""
    # The existing upstream test file where the PR's tests belong (its reviewers may ask to move them there).
    belongs_in: str = ""
    # The part of the change that runs only on CUDA (e.g. a host read of a device tensor): its description says that
    # it has not been run on a GPU (texts.NOT_RUN_ON_GPU) until `make open`'s GPU check replaces that line.
    cuda_only: str = ""

    @property
    def folder(self) -> str:
        return f"{self.position:02d}-{self.name}"

    def commit_message(self) -> str:
        """Message of the commit that adds this PR's new files."""
        if self.overlay_message:
            return self.overlay_message.rstrip() + "\n"
        names = ", ".join(f"`{Path(rel).name}`" for rel in self.overlay)
        return f"{self.title}\n\nThe new files of this change: {names}.\n"


def load_stack(project: Project) -> list[PR]:
    """The PRs of ``patches/stack.json`` in order; a malformed file is a clear error naming the entry."""
    path = project.stack_path
    where = project.rel(path)
    data = read_json(path, "stack file", where, " (it lists the PRs in review order)")
    if not isinstance(data, list):
        raise ForkError(f"stack file {where} must hold a list of PRs (bottom first)")
    prs = []
    for i, entry in enumerate(data, 1):
        label = f"{where}, entry {i}"
        if not isinstance(entry, dict):
            raise ForkError(f"{label} is not an object")
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ForkError(f"{label}: name {name!r} must be lower case letters, digits, '.', '_' or '-'")
        label = f"{where}, PR {name}"
        if entry.get("upstream") not in project.upstreams:
            raise ForkError(
                f"{label}: upstream {entry.get('upstream')!r} is not one of {', '.join(project.upstreams)} "
                f"(upstreams in {project.rel(project.config_path)})"
            )
        lists = {}
        for key in ("patches", "overlay", "tests", "depends_on"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ForkError(f"{label}: {key} must be a list of strings")
            lists[key] = value
        mutation = entry.get("mutation", [])
        if (
            not isinstance(mutation, list)
            or len(mutation) not in (0, 3)
            or not all(isinstance(v, str) for v in mutation)
        ):
            raise ForkError(f"{label}: mutation must be [file, old text, new text]")
        unknown = set(entry) - {
            "name",
            "upstream",
            "title",
            "description",
            "overlay_message",
            "issue_first",
            "mutation",
            "upstream_test_patch",
            "belongs_in",
            "cuda_only",
            *lists,
        }
        if unknown:
            raise ForkError(f"{label}: unknown key(s) {', '.join(sorted(unknown))}")
        prs.append(
            PR(
                name=name,
                upstream=entry["upstream"],
                title=str(entry.get("title") or name),
                position=i,
                description=str(entry.get("description") or ""),
                overlay_message=str(entry.get("overlay_message") or ""),
                issue_first=str(entry.get("issue_first") or ""),
                mutation=mutation,
                upstream_test_patch=str(entry.get("upstream_test_patch") or ""),
                belongs_in=str(entry.get("belongs_in") or ""),
                cuda_only=str(entry.get("cuda_only") or ""),
                **lists,
            )
        )
    return prs


def prs_of(prs: list[PR], upstream: Upstream) -> list[PR]:
    return [pr for pr in prs if pr.upstream == upstream.name]


def below(prs: list[PR], pr: PR) -> list[PR]:
    """The PRs under ``pr`` in its own upstream, in the stack (the fork holds them under it)."""
    own = [p for p in prs if p.upstream == pr.upstream]
    return own[: own.index(pr)]


def level_label(upstream: Upstream, prs: list[PR], pr: PR) -> str:
    return f"{upstream.label}" + "".join(f" + {p.name}" for p in [*dependencies(prs, pr), pr])


def stack_problems(project: Project, prs: list[PR]) -> list[str]:
    """Disagreements between the stack and the repository, each naming the PR and the file."""
    problems = []
    where = project.rel(project.stack_path)
    names = [pr.name for pr in prs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{where}: PR name {name} is used twice")
    for i, pr in enumerate(prs):
        for dep in pr.depends_on:
            if dep not in names:
                problems.append(f"{where}, PR {pr.name}: depends_on names {dep}, which is not in the stack")
            elif names.index(dep) >= i:
                problems.append(f"{where}, PR {pr.name}: depends on {dep}, which must come below it in the stack")
        if not pr.tests:
            problems.append(f"{where}, PR {pr.name}: lists no tests (its own tests run at its level)")
        if not pr.description:
            problems.append(f"{where}, PR {pr.name}: has no description file (docs/pr/{pr.name}.md)")
        elif not (project.root / pr.description).is_file():
            problems.append(f"{where}, PR {pr.name}: description {pr.description} does not exist")
        if pr.issue_first and not (project.root / pr.issue_first).is_file():
            problems.append(f"{where}, PR {pr.name}: issue_first {pr.issue_first} does not exist")
        if pr.upstream_test_patch and not (project.root / pr.upstream_test_patch).is_file():
            problems.append(f"{where}, PR {pr.name}: upstream_test_patch {pr.upstream_test_patch} does not exist")
        if not pr.patches and not pr.overlay:
            problems.append(f"{where}, PR {pr.name}: holds no patch and no overlay file")
    for upstream in project.upstreams.values():
        own = prs_of(prs, upstream)
        series = read_series(upstream)
        owner: dict[str, str] = {}
        for pr in own:
            for name in pr.patches:
                path = project.rel(upstream.patches_dir / name)
                if name in owner:
                    problems.append(f"{where}, PR {pr.name}: patch {path} already belongs to PR {owner[name]}")
                    continue
                owner[name] = pr.name
                if not (upstream.patches_dir / name).is_file():
                    problems.append(f"{where}, PR {pr.name}: patch {path} does not exist")
                elif name not in series:
                    problems.append(
                        f"{where}, PR {pr.name}: patch {path} is not listed in {project.rel(upstream.series_file)}"
                    )
        for name in series:
            if name not in owner:
                problems.append(
                    f"{where}: patch {project.rel(upstream.patches_dir / name)} belongs to no PR (add it to one)"
                )
        stack_order = [name for pr in own for name in pr.patches if name in series]
        if not problems and stack_order != series:
            problems.append(
                f"{project.rel(upstream.series_file)} orders the {upstream.name} patches differently from {where} "
                "(the series is the stack's patches, PR by PR, bottom first):\n    " + "\n    ".join(stack_order)
            )
        overlay = read_overlay(upstream)
        claimed: dict[str, str] = {}
        for pr in own:
            for rel in pr.overlay:
                shown = project.rel(repo_path(upstream, rel))
                if rel in claimed:
                    problems.append(
                        f"{where}, PR {pr.name}: overlay file {shown} already belongs to PR {claimed[rel]}"
                    )
                    continue
                claimed[rel] = pr.name
                if not under_roots(rel, upstream.overlay_roots):
                    problems.append(
                        f"{where}, PR {pr.name}: overlay file {rel} is outside the {upstream.name} overlay "
                        f"({', '.join(upstream.overlay_roots)})"
                    )
                elif rel not in overlay:
                    problems.append(f"{where}, PR {pr.name}: overlay file {shown} does not exist")
        for rel in overlay:
            if rel not in claimed:
                problems.append(
                    f"{where}: overlay file {project.rel(repo_path(upstream, rel))} belongs to no PR (add it to one)"
                )
    return problems


class PassesWithoutFix(str):
    """The problem of a PR whose tests pass without its fix (the base may have fixed the bug itself)."""


class LevelConflict(ForkError):
    """A PR's series does not apply at its level (``level`` is that PR), or on the PRs below it in the stack."""

    def __init__(self, project: Project, upstream: Upstream, prs: list[PR], pr: PR, err: PatchConflict, level=None):
        self.pr, self.conflict = pr, err
        files = f" (failed: {', '.join(err.files)})" if err.files else ""
        where = (
            f"at the level of PR {level.name}, {level_label(upstream, prs, level)}"
            if level is not None
            else f"on the PRs below it in {project.rel(project.stack_path)}, "
            + " + ".join([upstream.label, *(p.name for p in below(prs, pr))])
        )
        fix = (
            "Make it apply on the pristine base plus its depends_on: edit in the fork (`build -3`) and export."
            if level is not None
            else "Rebase it on the PRs below it: edit in the fork (`build -3`), export, and check the stack order."
        )
        super().__init__(
            f"PR {pr.name}: patch {project.rel(upstream.patches_dir / err.patch)} does not apply {where}{files}\n"
            "  git said:\n    " + "\n    ".join(err.output.splitlines()[-8:]) + f"\n  {fix}"
        )


def build_levels(
    project: Project, upstream: Upstream, prs: list[PR], dest: Path, env: dict | None = None, reset_author=False
) -> Path:
    """A scratch repository at ``dest``: the pristine sdist tagged ``upstream-base``; at HEAD every PR of
    ``upstream`` in stack order (its overlay files in one commit, then its patches), as the fork holds them; and for
    each PR its level, the base plus its dependencies (tag ``deps/<name>``) plus itself (tag ``level/<name>``).
    Raises LevelConflict."""
    create_pristine(upstream, obtain_sdist(project, upstream), dest)
    overlay = read_overlay(upstream)

    def add(pr: PR, level: PR | None):
        add_overlay(dest, {rel: overlay[rel] for rel in pr.overlay if rel in overlay}, pr.commit_message(), env=env)
        try:
            apply_patches(upstream, dest, pr.patches, env=env, reset_author=reset_author)
        except PatchConflict as err:
            git(dest, "am", "--abort", check=False)
            raise LevelConflict(project, upstream, prs, pr, err, level) from None

    own = prs_of(prs, upstream)
    for pr in own:
        add(pr, None)
    stack = git(dest, "rev-parse", "HEAD").stdout.decode().strip()
    for pr in own:
        git(dest, "checkout", "-q", "--detach", BASE_REF)
        for dep in dependencies(prs, pr):
            add(dep, pr)
        git(dest, "tag", DEPS_TAG + pr.name)
        add(pr, pr)
        git(dest, "tag", LEVEL_TAG + pr.name)
    git(dest, "checkout", "-q", "--detach", stack)
    return dest


def dependencies(prs: list[PR], pr: PR) -> list[PR]:
    """The PRs of ``pr``'s upstream that it depends on, directly or through others (``depends_on``), stack order."""
    by_name = {p.name: p for p in prs}
    needed, todo = set(), list(pr.depends_on)
    while todo:
        name = todo.pop()
        if name in by_name and name not in needed:
            needed.add(name)
            todo += by_name[name].depends_on
    return [p for p in below(prs, pr) if p.name in needed]


def level_ref(pr: PR) -> str:
    return LEVEL_TAG + pr.name


GUARD_PLUGIN = textwrap.dedent(
    '''\
    """Loaded by the workbench into each level's pytest run: the package under test must be the level's copy."""
    import importlib
    import os
    from pathlib import Path

    import pytest


    def pytest_configure(config):
        package, src = os.environ["WORKBENCH_LEVEL_PACKAGE"], Path(os.environ["WORKBENCH_LEVEL_SRC"]).resolve()
        module = importlib.import_module(package)
        if not Path(module.__file__).resolve().is_relative_to(src):
            raise pytest.UsageError(f"{package} was imported from {module.__file__}, not from the level at {src}")
    '''
)


def remove_fix(checkout: Path, pr: PR, base: str) -> str | None:
    """Take ``pr``'s fix out of ``checkout`` (its level): apply its ``mutation``, or put every file it changes outside
    ``tests/`` back as it is at ``base``. Returns a problem or None."""
    if pr.mutation:
        rel, old, new = pr.mutation
        path = checkout / rel
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if text.count(old) != 1:
            return f"PR {pr.name}: its mutation's text must occur once in {rel}, found {text.count(old)} times"
        path.write_text(text.replace(old, new), encoding="utf-8")
        drop_bytecode(path)
        return None
    added, modified = changed_files(checkout, base, "HEAD")
    library = [f for f in added + modified if not f.startswith("tests/")]
    if not library:
        return (
            f"PR {pr.name}: changes no file outside tests/ and has no mutation, so nothing shows what its tests guard"
        )
    for rel in library:
        if rel in added:
            (checkout / rel).unlink()
        else:
            git(checkout, "checkout", base, "--", rel)
        drop_bytecode(checkout / rel)
    return None


def drop_bytecode(path: Path) -> None:
    """Removes the cached bytecode of ``path``: Python trusts it while the source keeps its size and its mtime's second,
    so a fix undone within the second it was tested in, by a change of the same size, would still run."""
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()


def run_level_tests(
    project: Project,
    upstream: Upstream,
    repo: Path,
    prs: list[PR],
    pr: PR,
    tests: list[str],
    scratch: Path,
    pytest_args: list[str],
    stock: list[Path] = (),
    without_fix: bool = False,
) -> str | None:
    """Run ``tests`` (node ids relative to the upstream root) at ``pr``'s level, with the source folders ``stock``
    (the released other upstreams) next on the path; return a problem or None. With ``without_fix``, run them with the
    PR's fix taken out (``remove_fix``): then they must fail."""
    checkout = scratch / (f"level-{pr.name}" + ("-without-fix" if without_fix else ""))
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), level_ref(pr))
    try:
        if without_fix:
            problem = remove_fix(checkout, pr, DEPS_TAG + pr.name)
            if problem:
                return problem
        return _run_tests(project, upstream, checkout, prs, pr, tests, scratch, pytest_args, stock, without_fix)
    finally:
        git(repo, "worktree", "remove", "--force", str(checkout), check=False)


def stock_sources(project: Project, scratch: Path) -> dict[str, Path]:
    """``{upstream: its pristine src/ folder}`` under ``scratch``: the released versions a PR of another upstream is
    tested against (a transformers PR against stock accelerate, not against our accelerate fork, whose fix could hide
    the bug the PR fixes)."""
    stock = {}
    for upstream in project.upstreams.values():
        dest = scratch / f"stock-{upstream.name}"
        create_pristine(upstream, obtain_sdist(project, upstream), dest)
        stock[upstream.name] = dest / "src"
    return stock


def pr_test_results(
    project: Project, upstream: Upstream, repo: Path, prs: list[PR], scratch: Path, pytest_args: str, stock: dict
) -> dict[str, tuple[str | None, str | None]]:
    """Run each PR of ``upstream`` at its level in ``repo`` (``build_levels``), with its fix and without it, against
    the ``stock`` sources of the other upstreams: ``{PR name: (problem with the fix, problem without it)}``."""
    others = [path for name, path in stock.items() if name != upstream.name]
    args = shlex.split(pytest_args)
    return {
        pr.name: tuple(
            run_level_tests(project, upstream, repo, prs, pr, pr.tests, scratch, args, others, without_fix)
            for without_fix in (False, True)
        )
        for pr in prs_of(prs, upstream)
    }


def without_workers(pytest_args: list[str]) -> list[str]:
    """``pytest_args`` without pytest-xdist's ``-n``/``--numprocesses``."""
    kept, skip = [], False
    for arg in pytest_args:
        if skip:
            skip = False
        elif arg in ("-n", "--numprocesses"):
            skip = True
        elif not (arg.startswith("--numprocesses=") or (arg.startswith("-n") and len(arg) > 2)):
            kept.append(arg)
    return kept


def _run_tests(project, upstream, checkout, prs, pr, tests, scratch, pytest_args, stock, without_fix) -> str | None:
    guard = scratch / "guard"
    guard.mkdir(exist_ok=True)
    (guard / "workbench_level_guard.py").write_text(GUARD_PLUGIN, encoding="utf-8")
    src = checkout / "src"
    env = clean_test_env(  # none of the caller's other variables (testenv.py)
        PYTHONPATH=os.pathsep.join([str(src), *map(str, stock), str(guard), str(UTILS)]),
        WORKBENCH_LEVEL_PACKAGE=upstream.module,
        WORKBENCH_LEVEL_SRC=str(src),
    )
    python = project.venv / "bin" / "python"
    cmd = [str(python), "-m", "pytest", "-p", "workbench_level_guard", "-p", "pytest_global_state"]
    report = scratch / f"{pr.name}-without-fix.xml"
    if without_fix:  # in one process, up to the first failure (pytest-xdist reports an interrupted run otherwise);
        pytest_args = [*without_workers(pytest_args), "-x", f"--junit-xml={report}"]
        # Quiet (transformers' log_cli would name each test with its outcome), no traceback, captured output, warnings
        # or summary, in the pytest a test starts in a subprocess too: a log reader must not take expected failures
        # for failures. The line after the run names each test that failed, with the first line of its message.
        quiet = "-q -o log_cli=false --tb=no --show-capture=no --disable-warnings -rN"
        env["PYTEST_ADDOPTS"] = quiet
    cmd += ["-p", "no:cacheprovider", *pytest_args, *tests]
    sys.stderr.flush()
    with_stock = "".join(f", stock {Path(p).parent.name.removeprefix('stock-')}" for p in stock)
    what = "without its fix (" + ("its mutation" if pr.mutation else "its changes outside tests/ undone") + ")"
    where = f"{level_label(upstream, prs, pr)}{with_stock}"
    print(
        f"\n== PR {pr.name} {what if without_fix else 'at its level'} ({where}): pytest {' '.join(tests)}", flush=True
    )
    started = time.monotonic()
    try:  # stream the output where there is a real terminal or log file, else (captured) print it afterwards
        sys.stdout.fileno()
        proc = run_tests(cmd, cwd=checkout, env=env, stdin=subprocess.DEVNULL)
    except (AttributeError, OSError, ValueError):
        proc = run_tests(cmd, cwd=checkout, env=env, stdin=subprocess.DEVNULL, capture=True)
        print(proc.stdout + proc.stderr, flush=True)
    seconds = f"{time.monotonic() - started:.0f} s"
    if without_fix:
        # 1: a test failed; 2: collection failed (e.g. the test imports a module the fix adds)
        if proc.returncode in (1, 2):
            failed = ", ".join(
                c["test"].rpartition("::")[2] + (f" ({first_line(c['message'])})" if c.get("message") else "")
                for c in test_cases(report)
                if c["outcome"] in ("failed", "error")
            )
            failed = failed or "no report"
            print(f"== PR {pr.name}: its tests fail {what}, as they must ({seconds}): {failed}", flush=True)
            return None
        outcome = "pass" if proc.returncode == 0 else f"do not run (pytest exit status {proc.returncode})"
        problem = f"PR {pr.name}: its tests {outcome} {what}, at {where}: they must fail there: {' '.join(tests)}"
        return PassesWithoutFix(problem) if proc.returncode == 0 else problem
    if proc.returncode == 0:
        print(f"== PR {pr.name}: its tests pass at its level ({seconds})", flush=True)
        return None
    what = "collected no tests" if proc.returncode == 5 else f"failed (pytest exit status {proc.returncode})"
    return f"PR {pr.name}: its tests {what} at its level, {level_label(upstream, prs, pr)}: {' '.join(tests)}"


def first_line(message: str, width: int = 100) -> str:
    """The first line of a test's failure message, cut to ``width`` characters."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def doc_pages(upstream: Upstream, pr: PR) -> list[tuple[str, str]]:
    """``(local, title)`` of the doc pages ``pr`` adds (``docs/source/en/**.md``), for ``_toctree.yml``."""
    pages = []
    for rel in pr.overlay:
        if rel.startswith("docs/source/en/") and rel.endswith(".md"):
            text = repo_path(upstream, rel).read_text(encoding="utf-8")
            title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), Path(rel).stem)
            pages.append((rel[len("docs/source/en/") : -len(".md")], title))
    return pages


def changed_files(repo: Path, start: str, end: str) -> tuple[list[str], list[str]]:
    """Files ``start..end`` adds and files it modifies."""
    base = ls_tree(repo, start)
    changed = git(repo, "diff", "--name-only", "--no-renames", start, end).stdout.decode().split("\n")
    changed = [f for f in changed if f]
    return [f for f in changed if f not in base], [f for f in changed if f in base]
