"""``open`` (``make open CLONE=../transformers [PR=name]``): the stack's PRs on a contributor's clone of upstream's
main, each proven there before it is pushed; and the branches alone (``build --clone``).

For each PR of the clone's upstream (or the one named), starting from the clone's ``main`` as it is when the command
starts (or ``--base REF``), never from whatever branch is checked out:

1. its branch: the PR and what it depends on, its new files in one commit and its patches applied three-way, authored
   by the contributor's git identity. Its tests go where upstream keeps them when the clone has that file (the PR's
   ``belongs_in``): its ``upstream_test_patch`` (``patches/transformers-tests/``) is applied to upstream's real test file
   instead of adding its new test file (refused by name if it does not apply); without that file it keeps its new file.
   A PR that does not apply gets its row (the patch, the files, git's own reason and how to go on: where the clone
   lacks the release's files, the `git fetch` that brings them) and the others go on; no branch is left half made
   unless ``--keep-conflict`` asks for it;
2. its tests with its fix (they must pass) and without it (its changes outside ``tests/`` undone: they must fail);
3. upstream's suite (``tests/trainer``) under the global-state guard (``utils/pytest_global_state.py``) with
   ``pytest -n auto``: once on the base and once with every PR stacked; each test whose outcome or leaks differ runs
   again, alone, on the base and on each PR's branch, which names the PR that changes it (new tests belong to the PR
   whose files hold them);
4. on a machine with CUDA, ``bench/gpu_check.py``, its summary written into ``dist/``'s PR texts where they hold the
   placeholder (``GPU_PLACEHOLDER``); without CUDA one line says so.

Then one table per PR, "ready to push" where everything holds. Everything runs in git worktrees in a temporary folder:
the clone's working tree, its checked-out branch and its other branches stay as they were; the PR branches are created
at the end, all at once. Whatever stops a run (Ctrl-C included), no worktree, branch or temporary folder is left.
Nothing is pushed. Exit status: 0 when every PR is ready to push, 1 otherwise or on a conflict, 2 on bad input (nothing
changed), 130 on Ctrl-C or SIGTERM.
"""

import ast
import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .gitutil import (
    BadInput,
    ForkError,
    PatchConflict,
    am_in_progress,
    contributor_env,
    git,
    git_text,
    parse_author,
    rev_parse,
    status_paths,
)
from .overlay import add_overlay, is_skipped, read_overlay
from .project import Project, Upstream
from .series import apply_patches
from .sources import build_stock, stock_dir
from .stack import GUARD_PLUGIN, PR, UTILS, changed_files, dependencies, load_stack, prs_of, remove_fix, stack_problems
from .testenv import pytest_refusal, run_tests
from .texts import NOT_RUN_ON_GPU, RAN_ON_GPU


# Upstream's own tests that run on the base and on the branches, per upstream (`--suite` chooses others).
SUITES = {"transformers": ["tests/trainer"], "accelerate": ["tests/test_optimizer.py"]}
# The line a PR text with a CUDA-only path says until the GPU check ran; `open` replaces it in dist/ with the check's
# summary.
GPU_PLACEHOLDER = NOT_RUN_ON_GPU
BAD_OUTCOMES = ("failed", "error")


# --------------------------------------------------------------------------------------------------------------
# The clone and the branches


@dataclass
class Branch:
    pr: PR
    name: str
    worktree: Path
    start: str = ""  # the base plus what the PR depends on
    head: str = ""
    tests: list[str] = field(default_factory=list)
    test_home: str = ""  # where its tests are, in words
    files: list[str] = field(default_factory=list)  # what its own commits change
    added: list[str] = field(default_factory=list)  # the files among them it adds


def clone_upstream(project: Project, clone: Path, names: list[str] | None) -> Upstream:
    """The upstream a contributor's clone is of: the one whose package folder it holds (``--upstream`` must agree)."""
    found = [u for u in project.upstreams.values() if (clone / "src" / u.module).is_dir()]
    if names:
        wanted = project.select(names)
        if len(wanted) != 1:
            raise BadInput("--clone takes one --upstream")
        if found and wanted[0] not in found:
            raise BadInput(f"{clone} is a clone of {found[0].name}, not of {wanted[0].name}")
        return wanted[0]
    if len(found) != 1:
        raise BadInput(
            f"cannot tell which upstream {clone} is a clone of (no src/<package> of "
            f"{', '.join(u.name for u in project.upstreams.values())}): pass --upstream NAME"
        )
    return found[0]


def git_config(clone: Path, key: str) -> str:
    """The contributor's own setting (their global and the clone's configuration)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    proc = subprocess.run(["git", "config", key], cwd=clone, env=env, capture_output=True, text=True)
    return proc.stdout.strip()


def user_git_env(name: str, email: str) -> dict:
    """The contributor as author and committer, with their own git settings (hooks, config) in force."""
    env = contributor_env(name, email)
    for key in ("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL"):
        env.pop(key, None)
    return env


def dirty(clone: Path) -> list[str]:
    return [p for p in status_paths(clone) if not is_skipped(p)]


@dataclass
class Target:
    """What `open` and `build --clone` work on, checked before anything changes."""

    clone: Path
    upstream: Upstream
    prs: list[PR]  # the whole stack
    targets: list[PR]  # the PRs to branch, in stack order
    base: str  # the commit the branches start from
    base_label: str
    env: dict
    identity: str


def check_clone(project: Project, path: str | None) -> Path:
    """The contributor's clone named by ``--clone``: a git clone, neither this workbench nor its fork; else BadInput."""
    if not path:
        raise BadInput("name your clone of upstream: make open CLONE=../transformers (--clone PATH)")
    clone = Path(path).resolve()
    if clone == project.root:
        raise BadInput(f"{clone} is this workbench, not a clone of upstream")
    if not clone.is_dir() or not (clone / ".git").exists():
        raise BadInput(f"{clone} is not a git clone (no .git)")
    forks = [u for u in project.upstreams.values() if u.fork_dir.resolve() == clone]
    if forks:
        raise BadInput(
            f"{clone} is the workbench's fork of {forks[0].name} (`make fork` builds it, the stack applied), not a "
            f"clone of upstream: git clone https://github.com/huggingface/{forks[0].package} and name that"
        )
    return clone


def check_target(project: Project, args, command: str, all_prs: bool) -> Target:
    """The clone, its upstream, the PRs, the base and the contributor's identity; BadInput for anything wrong.
    ``all_prs``: without --pr, every PR of the upstream (`open`); else the top one with what it depends on."""
    clone = check_clone(project, args.clone)
    prs = load_stack(project)
    problems = stack_problems(project, prs)
    if problems:
        raise BadInput("the stack is not consistent (run `make check`):\n  " + "\n  ".join(problems))
    if args.pr and args.pr not in {p.name for p in prs}:
        raise BadInput(f"--pr {args.pr}: no PR of that name in the stack ({', '.join(p.name for p in prs)})")
    named = next((p for p in prs if p.name == args.pr), None)
    upstream = clone_upstream(project, clone, args.upstream)
    if named is not None and named.upstream != upstream.name:
        raise BadInput(f"PR {named.name} is a {named.upstream} PR, but {clone} is a clone of {upstream.name}")
    own = prs_of(prs, upstream)
    if not own:
        raise BadInput(f"the stack has no PR for {upstream.name}")
    if named is not None:
        targets = [named] if all_prs else [*dependencies(prs, named), named]
    else:
        targets = own if all_prs else [*dependencies(prs, own[-1]), own[-1]]
    if am_in_progress(clone):
        raise BadInput(f"a `git am` is in progress in {clone}: finish it (git am --continue) or abort it first")
    changed = dirty(clone)
    if changed:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise BadInput(f"{clone} has uncommitted changes ({shown}): commit or stash them first")
    if args.author:
        name, email = parse_author(args.author)
    else:
        name, email = (git_config(clone, key) for key in ("user.name", "user.email"))
        unset = [key for key, value in (("user.name", name), ("user.email", email)) if not value]
        if unset:
            raise BadInput(
                f"git {' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set: the commits are authored by "
                f"you; set it with `git config --global {unset[0]} ...` or pass --author 'Name <email>'"
            )
    base_ref = args.base or "main"
    if base_ref in {p.name for p in prs}:
        raise BadInput(f"--base {base_ref} is a PR's branch: a PR branch starts from upstream's main")
    base = rev_parse(clone, base_ref)
    if base is None:
        raise BadInput(f"{clone} has no {base_ref!r} to start the branches from: name the base with --base REF")
    return Target(
        clone,
        upstream,
        prs,
        targets,
        base,
        f"{base_ref} ({base[:10]})",
        user_git_env(name, email),
        f"{name} <{email}>",
    )


def branch_name(args, pr: PR, single: bool) -> str:
    return args.branch if (args.branch and single) else pr.name


def check_branches(target: Target, names: list[str], force: bool) -> None:
    existing = [n for n in names if rev_parse(target.clone, f"refs/heads/{n}") is not None]
    if existing and not force:
        raise BadInput(
            f"branch {', '.join(existing)} exists in {target.clone}: pass --force to make it again (it is replaced)"
        )
    current = git_text(target.clone, "branch", "--show-current")
    if force and current in existing:
        raise BadInput(f"branch {current} is checked out in {target.clone}: check out main first to replace it")


def moves_tests(pr: PR, tree: Path) -> bool:
    """Whether the PR's tests go into upstream's own test file in ``tree`` (its test edit, not its new file)."""
    return bool(pr.upstream_test_patch and pr.belongs_in and (tree / pr.belongs_in).is_file())


def changed_tests(tree: Path, start: str, end: str) -> list[str]:
    """Node ids of the top-level test classes and functions that ``start..end`` changes in ``tests/`` files."""
    diff = git(tree, "diff", "-U0", "--no-renames", start, end, "--", "tests").stdout.decode(errors="replace")
    lines: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and path:
            m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
            first, count = int(m.group(1)), int(m.group(2) or 1)
            lines.setdefault(path, set()).update(range(first, first + max(count, 1)))
    ids = []
    for rel, touched in sorted(lines.items()):
        module = ast.parse((tree / rel).read_text(encoding="utf-8"))
        for node in module.body:
            inside = any(node.lineno <= n <= node.end_lineno for n in touched)
            if (
                inside
                and isinstance(node, ast.ClassDef)
                or (inside and isinstance(node, ast.FunctionDef) and node.name.startswith("test"))
            ):
                ids.append(f"{rel}::{node.name}")
    return ids


def add_pr(project: Project, upstream: Upstream, tree: Path, pr: PR, env: dict) -> bool:
    """One PR onto the worktree ``tree``: its new files (less its tests where they move into upstream's file) in one
    commit, its test edit, its patches, three-way. Returns whether its tests moved. Raises PatchConflict."""
    moved = moves_tests(pr, tree)
    overlay = read_overlay(upstream)
    files = {rel: overlay[rel] for rel in pr.overlay if rel in overlay and not (moved and rel.startswith("tests/"))}
    add_overlay(tree, files, pr.commit_message(), env)
    if moved:  # as its new test file would be: the tests first, then the fix
        apply_patches(upstream, tree, [str(project.root / pr.upstream_test_patch)], True, env, reset_author=True)
    apply_patches(upstream, tree, pr.patches, three_way=True, env=env, reset_author=True)
    return moved


def make_branch(project: Project, target: Target, pr: PR, name: str, worktree: Path, keep_branch: bool) -> Branch:
    """``pr`` and what it depends on, on a worktree of the clone at the base (detached unless ``keep_branch``, which
    makes the branch there at once: what --keep-conflict leaves)."""
    where = ["-b", name] if keep_branch else ["--detach"]
    git(target.clone, "worktree", "add", "-q", *where, str(worktree), target.base)
    branch = Branch(pr, name, worktree)
    for dep in dependencies(target.prs, pr):
        add_pr(project, target.upstream, worktree, dep, target.env)
    branch.start = rev_parse(worktree, "HEAD")
    moved = add_pr(project, target.upstream, worktree, pr, target.env)
    branch.head = rev_parse(worktree, "HEAD")
    added, modified = changed_files(worktree, branch.start, branch.head)
    branch.files, branch.added = added + modified, added
    if moved:
        rel = project.rel(project.root / pr.upstream_test_patch)
        branch.tests = changed_tests(worktree, branch.start, branch.head) or [pr.belongs_in]
        branch.test_home = f"in upstream's {pr.belongs_in} ({rel}), not as a new file"
    else:
        branch.tests = list(pr.tests)
        missing = f"; its home {pr.belongs_in} is not in the clone" if pr.upstream_test_patch else ""
        branch.test_home = f"in its new file(s) {', '.join(pr.tests)}{missing}"
    return branch


def remove_worktree(clone: Path, worktree: Path) -> None:
    git(clone, "worktree", "remove", "--force", str(worktree), check=False)
    shutil.rmtree(worktree, ignore_errors=True)


# What `git am -3` says where the clone lacks the blobs the patch was made on (a shallow clone, or an older main)
MISSING_BLOBS = "lacks necessary blobs"


def git_reason(output: str) -> list[str]:
    """git's own reason in ``git am``'s output: its error and conflict lines, not its hints or how to go on."""
    return [line.strip() for line in output.splitlines() if line.startswith(("error:", "fatal:", "CONFLICT"))][:6]


def fetch_command(target: Target) -> str:
    """The command that fetches the pinned release into the clone (its files are what the patches were made on)."""
    urls = git_text(target.clone, "remote", "-v").splitlines()
    upstream = next((u.split()[0] for u in urls if f"huggingface/{target.upstream.package}" in u), None)
    remote = upstream or (
        "origin"
        if any(u.startswith("origin\t") for u in urls)
        else f"https://github.com/huggingface/{target.upstream.package}"
    )
    shallow = git_text(target.clone, "rev-parse", "--is-shallow-repository") == "true"
    return f"git -C {target.clone} fetch {'--depth 1 ' if shallow else ''}{remote} tag v{target.upstream.version}"


def conflict_message(project: Project, target: Target, pr: PR, err: PatchConflict, kept: Path | None) -> str:
    patch = Path(err.patch)
    shown = project.rel(patch) if patch.is_absolute() else project.rel(target.upstream.patches_dir / err.patch)
    files = ", ".join(err.files) or "a file git does not name"
    head = (
        f"PR {pr.name}: {shown} does not apply on {target.base_label} of {target.clone}, even three-way: "
        f"conflict in {files}.\n" + "".join(f"  git: {line}\n" for line in git_reason(err.output))
    )
    if MISSING_BLOBS in err.output:
        shallow = git_text(target.clone, "rev-parse", "--is-shallow-repository") == "true"
        why = "the clone is shallow" if shallow else f"the clone's history lacks {target.upstream.label}"
        return (
            f"{head}The patches are made on {target.upstream.label}, and {why}: git lacks the files to merge with. "
            f"Fetch the release, then run make open again:\n  {fetch_command(target)}"
        )
    if kept is not None:
        return (
            f"{head}Branch {pr.name} is left in the middle of `git am` in the worktree {kept}. To go on:\n"
            f"  cd {kept}\n  # resolve {files}, then: git add <files> && git am --continue\n"
            f"  # then run its tests there; to drop it: git am --abort; cd {target.clone}; "
            f"git worktree remove --force {kept}; git branch -D {pr.name}"
        )
    return (
        f"{head}No branch is made for it (the clone is as it was). To go on, either resolve it on a branch: "
        f"`make open CLONE={target.clone} PR={pr.name} OPEN_ARGS=--keep-conflict` leaves branch {pr.name} in the "
        "middle of `git am` in a worktree next to the clone; or, where upstream's main moved past the pinned "
        "release, move the stack (`make upgrade`) and rebase the PR in build/transformers (`make patches`)."
    )


def build_branches(project: Project, target: Target, args, scratch: Path) -> tuple[list[Branch], dict[str, str]]:
    """One worktree per target PR under ``scratch``, and why each PR that has none failed (printed as it happens):
    a PR that does not apply is named with git's reason, and the others go on."""
    branches, failed = [], {}
    for pr in target.targets:
        name = branch_name(args, pr, len(target.targets) == 1)
        try:
            branches.append(make_branch(project, target, pr, name, scratch / f"pr-{pr.name}", False))
        except ForkError as err:
            remove_worktree(target.clone, scratch / f"pr-{pr.name}")
            if not isinstance(err, PatchConflict):
                failed[pr.name] = f"its branch could not be made: {err}"
                print(f"PR {pr.name}: {failed[pr.name]}", file=sys.stderr, flush=True)
                continue
            kept = None
            if getattr(args, "keep_conflict", False) and MISSING_BLOBS not in err.output:
                kept = target.clone.parent / f"{target.clone.name}-{pr.name}"
                if kept.exists():
                    print(f"(--keep-conflict: {kept} exists, so nothing is kept)", file=sys.stderr)
                    kept = None
                else:
                    try:
                        make_branch(project, target, pr, name, kept, True)
                    except PatchConflict:
                        pass
            print(conflict_message(project, target, pr, err, kept), file=sys.stderr, flush=True)
            reason = git_reason(err.output)
            cause = next((line for line in reason if MISSING_BLOBS in line or line.startswith("CONFLICT")), "")
            failed[pr.name] = f"{Path(err.patch).name} does not apply, even three-way ({', '.join(err.files)}): " + (
                cause or (reason[-1] if reason else "see above")
            )
            continue
        print(
            f"PR {pr.name}: applies on {target.base_label} ({len(commits(target.clone, target.base, branches[-1].head))}"
            f" commit(s)); its tests {branches[-1].test_home}",
            flush=True,
        )
    return branches, failed


def commits(repo: Path, start: str, end: str) -> list[str]:
    return git_text(repo, "rev-list", f"{start}..{end}").split()


def set_branches(target: Target, branches: list[Branch]) -> None:
    """The branches, all or none (one `git update-ref` transaction)."""
    updates = "".join(f"update refs/heads/{branch.name} {branch.head}\n" for branch in branches)
    git(target.clone, "update-ref", "-m", "make open", "--stdin", input=updates.encode(), env=target.env)


def build_clone(project: Project, args) -> int:
    """``build --clone``: the PR named (with what it depends on; default the top one) on a branch of the clone, made
    from the clone's main (or --base), never from the branch it has checked out; the clone's checkout stays."""
    target = check_target(project, args, "build --clone", all_prs=False)
    top = target.targets[-1]
    name = args.branch or top.name
    check_branches(target, [name], args.force)
    with tempfile.TemporaryDirectory(prefix="fork-clone-") as tmp:
        try:
            worktree = Path(tmp) / "branch"
            try:
                branch = make_branch(project, target, top, name, worktree, False)
            except PatchConflict as err:
                raise ForkError(conflict_message(project, target, top, err, None)) from None
            set_branches(target, [branch])
        finally:
            remove_worktree(target.clone, Path(tmp) / "branch")
    levels = ", ".join(p.name for p in target.targets)
    print(f"Branch {name} of {target.clone} now holds {levels} on {target.base_label}, authored by {target.identity}.")
    print(
        f"Prove it there with `make open CLONE={target.clone} PR={top.name}`; then push it and open the PR with "
        f"dist/{top.folder}/PR_DESCRIPTION.md."
    )
    return 0


# --------------------------------------------------------------------------------------------------------------
# Test runs


@dataclass
class Run:
    label: str
    outcomes: dict[str, str]
    leaks: dict[tuple[str, str], str]  # (test, what) -> how
    collect_errors: dict[str, str]
    wall: float
    cpu: float
    status: int
    collected: int = 0  # the tests pytest collected (what --collect-only counts)

    def count(self) -> str:
        tally = {}
        for outcome in self.outcomes.values():
            tally[outcome] = tally.get(outcome, 0) + 1
        parts = [f"{n} {o}" for o, n in sorted(tally.items(), key=lambda item: -item[1])]
        errors = f", {len(self.collect_errors)} file(s) not collected" if self.collect_errors else ""
        return f"{len(self.outcomes)} tests ({', '.join(parts) or 'none'}){errors}"


@dataclass
class Runner:
    project: Project
    upstream: Upstream
    scratch: Path
    pytest_args: list[str]
    stock: Path

    def run(self, tree: Path, label: str, tests: list[str], workers: str | None = None, first_failure=False) -> Run:
        """pytest on ``tests`` in ``tree`` (its ``src`` imported, the other upstreams' releases next), under the
        global-state guard; outcomes, leaks, collection errors, wall and CPU time."""
        guard = self.scratch / "plugins"
        guard.mkdir(exist_ok=True)
        (guard / "workbench_level_guard.py").write_text(GUARD_PLUGIN, encoding="utf-8")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label)
        state, outcomes, output = (self.scratch / f"{slug}.{ext}" for ext in ("state.jsonl", "outcomes.json", "out"))
        for path in (state, outcomes):
            path.unlink(missing_ok=True)
        src = tree / "src"
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join(
                [str(src), str(self.stock), str(guard), str(UTILS)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            ),
            WORKBENCH_LEVEL_PACKAGE=self.upstream.module,
            WORKBENCH_LEVEL_SRC=str(src),
        )
        python = self.project.venv / "bin" / "python"
        cmd = [str(python), "-m", "pytest", "-p", "workbench_level_guard", "-p", "pytest_global_state"]
        cmd += ["-p", "pytest_outcome_log", "-p", "no:cacheprovider", f"--global-state-log={state}"]
        cmd += [f"--outcome-log={outcomes}", f"--rootdir={tree}", "-q", "-rN", "--continue-on-collection-errors"]
        cmd += ["-o", "log_cli=false"]
        cmd += (["-n", workers] if workers else []) + (["-x"] if first_failure else []) + self.pytest_args + tests
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        with open(output, "w", encoding="utf-8") as out:
            proc = run_tests(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
        try:
            data = json.loads(outcomes.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # pytest stopped before its session (e.g. a conftest.py that does not import)
            from pytest_outcome_log import cause  # utils/pytest_outcome_log.py

            lines = output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            problem = cause(line for line in lines if line.startswith("E "))
            problem = problem or (lines[-1] if lines else f"pytest exit status {proc.returncode}")
            data = {"tests": {}, "collect_errors": {" ".join(tests): problem}}
        leaks = {}
        import census  # utils/census.py: it reads the guard's log

        found = census.read_log(state)
        for test, what, how in found["leaks"]:
            leaks[(test, what)] = how
        for what, tests in found["unattributed"]:
            leaks[("(not attributed: " + ", ".join(sorted(tests)) + ")", what)] = "left behind"
        return Run(
            label, data["tests"], leaks, data["collect_errors"], wall, cpu, proc.returncode, data.get("collected", 0)
        )


def collection(project: Project, upstream: Upstream, tree: Path, suite: list[str], scratch: Path) -> Run:
    """Whether upstream's ``suite`` imports in ``tree`` with the venv: pytest --collect-only, run as `open` runs the
    suite (``collected`` and ``collect_errors`` say what it found)."""
    build_stock(project, stock_dir(project))
    return Runner(project, upstream, scratch, ["--collect-only"], stock_dir(project)).run(tree, "collect", suite)


def not_collected(run: Run) -> str:
    """Why a run collected nothing or not everything: each file that did not collect with its error (the
    ``ImportError`` line), or that no test was collected."""
    return "; ".join(f"{f}: {m}" for f, m in run.collect_errors.items()) or "no test collected"


def clock(run: Run) -> str:
    return f"wall {run.wall:.0f} s, CPU {run.cpu:.0f} s"


def pr_tests_outcome(run: Run, tests: list[str]) -> dict[str, str]:
    """The outcomes of the tests ``tests`` (node ids or their prefixes) name."""
    return {t: o for t, o in run.outcomes.items() if any(t == n or t.startswith(n + "::") for n in tests)}


@dataclass
class Diff:
    changed: dict[str, tuple[str, str]]  # existing tests whose outcome changed: (base, branch)
    new: dict[str, str]
    gone: list[str]
    leaks_added: dict[tuple[str, str], str]
    leaks_removed: dict[tuple[str, str], str]
    errors_added: dict[str, str]
    errors_removed: list[str]


def diff(base: Run, branch: Run) -> Diff:
    common = base.outcomes.keys() & branch.outcomes.keys()
    return Diff(
        changed={
            t: (base.outcomes[t], branch.outcomes[t]) for t in sorted(common) if base.outcomes[t] != branch.outcomes[t]
        },
        new={t: branch.outcomes[t] for t in sorted(branch.outcomes.keys() - base.outcomes.keys())},
        gone=sorted(base.outcomes.keys() - branch.outcomes.keys()),
        leaks_added={k: v for k, v in sorted(branch.leaks.items()) if k not in base.leaks},
        leaks_removed={k: v for k, v in sorted(base.leaks.items()) if k not in branch.leaks},
        errors_added={f: m for f, m in sorted(branch.collect_errors.items()) if f not in base.collect_errors},
        errors_removed=sorted(f for f in base.collect_errors if f not in branch.collect_errors),
    )


def test_file(node: str) -> str:
    return node.split("::")[0]


# --------------------------------------------------------------------------------------------------------------
# GPU


def has_cuda(python: Path) -> bool:
    """Whether torch sees CUDA here (asked only where an NVIDIA driver is there at all)."""
    if not Path("/proc/driver/nvidia").exists() and shutil.which("nvidia-smi") is None:
        return False
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def gpu_sentence(summary: str) -> str:
    """The line that replaces a description's GPU_PLACEHOLDER: the GPU, torch and each part's outcome of the check's
    summary (`bench/gpu_check.txt`), in words upstream reads (no path or name of the workbench)."""
    where = ", ".join(
        f"{what} {m.group(1)}" if what == "torch" else m.group(1)
        for what, pattern in (("GPU", r"\bGPU (.+?)(?:  |$)"), ("torch", r"\btorch (\S+)"))
        if (m := re.search(pattern, summary, re.MULTILINE))
    )
    parts = [line for line in summary.splitlines() if re.match(r"[a-z_]+: ", line)]
    return f"{RAN_ON_GPU}{f' ({where})' if where else ''}: " + "; ".join(parts) + "."


def gpu_check(project: Project, tree: Path, prs: list[PR]) -> tuple[str, bool | None]:
    """bench/gpu_check.py on the branch's sources: (summary, passed), passed None where it did not run."""
    python = project.venv / "bin" / "python"
    if not has_cuda(python):
        print("GPU check: not run, no CUDA on this machine (bench/gpu_check.py needs one NVIDIA GPU)", flush=True)
        return "not run (no CUDA)", None
    out = project.root / "build" / "open"
    cmd = [str(python), str(project.root / "bench/gpu_check.py"), "--out", str(out), "--require-cuda"]
    cmd += ["--transformers-src", str(tree / "src")]
    accelerate = project.upstreams.get("accelerate")
    if accelerate is not None and (accelerate.fork_dir / "src").is_dir():
        cmd += ["--accelerate-src", str(accelerate.fork_dir / "src")]
        cmd += ["--stock-accelerate-src", str(stock_dir(project))]
    print("GPU check: " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, cwd=project.root, stdin=subprocess.DEVNULL)
    summary_file = out / "gpu_check.txt"
    summary = summary_file.read_text(encoding="utf-8").strip() if summary_file.is_file() else "no summary written"
    passed = proc.returncode == 0
    print(summary, flush=True)
    dist = project.root / "dist"
    sentence = gpu_sentence(summary)
    for pr in prs:
        text = dist / pr.folder / "PR_DESCRIPTION.md"
        if text.is_file() and GPU_PLACEHOLDER in text.read_text(encoding="utf-8"):
            text.write_text(text.read_text(encoding="utf-8").replace(GPU_PLACEHOLDER, sentence), encoding="utf-8")
            print(f"GPU check: its summary is in {project.rel(text)} (was: {GPU_PLACEHOLDER!r})", flush=True)
    return ("passed" if passed else "FAILED") + f" ({project.rel(out)}/gpu_check.txt)", passed


# --------------------------------------------------------------------------------------------------------------
# open


@dataclass
class Verdict:
    with_fix: str = ""
    with_fix_ok: bool = False
    without_fix: str = ""
    without_fix_ok: bool = False
    changes: list[str] = field(default_factory=list)
    changes_bad: bool = False
    leaks: list[str] = field(default_factory=list)
    leaks_bad: bool = False
    new_tests: str = ""


def describe_outcomes(outcomes: dict[str, str]) -> str:
    tally = {}
    for o in outcomes.values():
        tally[o] = tally.get(o, 0) + 1
    return ", ".join(f"{n} {o}" for o, n in sorted(tally.items())) or "no test ran"


def cmd_open(project: Project, args) -> int:
    target = check_target(project, args, "open", all_prs=True)
    names = [branch_name(args, pr, len(target.targets) == 1) for pr in target.targets]
    check_branches(target, names, args.force)
    suite = args.suite or SUITES.get(target.upstream.name, ["tests"])
    missing = [rel for rel in suite if not (target.clone / rel).exists()]
    if missing:
        raise BadInput(f"{target.clone} has no {', '.join(missing)} (upstream's tests to run): pass --suite PATH")
    if not (project.venv / "bin" / "python").exists():
        raise BadInput(f"no virtual environment at {project.rel(project.venv)}: run `make fork` first")
    refusal = pytest_refusal(args.pytest_args, str(project.venv / "bin" / "python"), target.clone / "conftest.py")
    if refusal:
        raise BadInput(f"--pytest-args: {refusal}")
    started = time.monotonic()
    print(
        f"make open: {', '.join(p.name for p in target.targets)} on {target.base_label} of {target.clone}, "
        f"authored by {target.identity}",
        flush=True,
    )
    scratch = Path(tempfile.mkdtemp(prefix="workbench-open-"))
    made: list[str] = []  # the branches made, once they are
    terminate = signal.signal(signal.SIGTERM, interrupt)  # `kill` or `timeout` stops it as Ctrl-C does
    try:
        return open_prs(project, target, args, suite, scratch, made, started)
    except KeyboardInterrupt:
        left = f"branches {', '.join(made)} were made" if made else "no branch was made"
        print(
            f"fork.py open: interrupted: {left}; the run's worktrees and temporary folder are removed, the clone is "
            "otherwise as it was; run the same command again to go on.",
            file=sys.stderr,
        )
        return 130
    finally:
        with ignored(signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C does not stop the clean-up half way
            remove_scratch(target.clone, scratch)
        signal.signal(signal.SIGTERM, terminate)


def interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def ignored(*signums):
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def remove_scratch(clone: Path, scratch: Path) -> None:
    """The run's temporary folder and the worktrees in it, whatever stopped the run (git forgets the worktrees; one
    that Ctrl-C stopped inside `git worktree add` is still locked as "initializing", which prune skips)."""
    shutil.rmtree(scratch, ignore_errors=True)
    listed = git(clone, "worktree", "list", "--porcelain", check=False).stdout.decode(errors="replace").splitlines()
    for path in (line.removeprefix("worktree ") for line in listed if line.startswith("worktree ")):
        if Path(path).resolve().is_relative_to(scratch.resolve()):
            git(clone, "worktree", "unlock", path, check=False)
    git(clone, "worktree", "prune", check=False)


def open_prs(project: Project, target: Target, args, suite: list[str], scratch: Path, made: list[str], started) -> int:
    build_stock(project, stock_dir(project))
    branches, refused = build_branches(project, target, args, scratch)
    if not branches:
        return tables(target, args, [], {}, refused, {}, "", None, made, started)
    runner = Runner(project, target.upstream, scratch, shlex.split(args.pytest_args), stock_dir(project))
    base_tree = scratch / "base"
    git(target.clone, "worktree", "add", "-q", "--detach", str(base_tree), target.base)
    unstacked: dict[str, str] = {}  # a PR that applies on the base alone but not on the PRs before it
    if len(branches) > 1:
        stacked = scratch / "stacked"
        git(target.clone, "worktree", "add", "-q", "--detach", str(stacked), target.base)
        for branch in branches:
            proc = git(
                stacked, "cherry-pick", "--allow-empty", f"{branch.start}..{branch.head}", env=target.env, check=False
            )
            if proc.returncode != 0:
                git(stacked, "cherry-pick", "--abort", check=False)
                reason = git_reason((proc.stdout + proc.stderr).decode(errors="replace"))
                unstacked[branch.pr.name] = (
                    f"on {target.base_label} alone, but not on the PRs before it in the stack (run `make check`)"
                    + (f": {reason[0]}" if reason else "")
                )
                print(f"PR {branch.pr.name}: applies {unstacked[branch.pr.name]}", file=sys.stderr, flush=True)
    else:
        stacked = branches[0].worktree
    workers = args.workers if args.workers != "0" else None
    label = "all PRs stacked" if len(branches) > 1 else f"branch {branches[0].name}"
    if unstacked:
        label = f"the PRs stacked but {', '.join(unstacked)}"
    print(
        f"\n== upstream's {' '.join(suite)} on {target.base_label} (pytest -n {args.workers}, global-state guard)",
        flush=True,
    )
    base_run = runner.run(base_tree, "base-suite", suite, workers)
    print(f"   {base_run.count()}; {clock(base_run)}", flush=True)
    if not base_run.outcomes:
        raise BadInput(
            f"upstream's {' '.join(suite)} does not run on {target.base_label}: {not_collected(base_run)}\n(a venv "
            'with the clone\'s own test dependencies runs it: `make clone-venv CLONE=...`; then OPEN_ARGS="--venv DIR")'
        )
    print(f"== the same on {label}", flush=True)
    stacked_run = runner.run(stacked, "stacked-suite", suite, workers)
    print(f"   {stacked_run.count()}; {clock(stacked_run)}", flush=True)
    d = diff(base_run, stacked_run)
    # Existing tests that differ, and files that stopped or started collecting: run again alone on the base and
    # on each branch, which names the PR (compared with the same rerun on the base, so that order or flakiness
    # under -n does not count against a PR)
    again = sorted(
        set(d.changed)
        | {t for t, _ in [*d.leaks_added, *d.leaks_removed] if t in base_run.outcomes and t in stacked_run.outcomes}
        | {f for f in [*d.errors_added, *d.errors_removed] if (base_tree / f).exists()}
    )
    base_again = (
        runner.run(base_tree, "base-again", again)
        if again and len(branches) > 1
        else Run("base-again", {}, {}, {}, 0, 0, 0)
    )
    verdicts: dict[str, Verdict] = {}
    for branch in branches:
        v = verdicts[branch.pr.name] = Verdict()
        print(
            f"\n== PR {branch.pr.name}: its tests with its fix ({' '.join(branch.tests)})"
            + (
                f", and {len(again)} upstream test(s) whose outcome or leaks differ, again"
                if again and len(branches) > 1
                else ""
            ),
            flush=True,
        )
        own = runner.run(
            branch.worktree,
            f"{branch.pr.name}-with-fix",
            branch.tests + ([t for t in again if t not in branch.tests] if len(branches) > 1 else []),
        )
        mine = pr_tests_outcome(own, branch.tests)
        bad = {t: o for t, o in mine.items() if o in BAD_OUTCOMES}
        bad.update({t: f"left {what} changed" for t, what in own.leaks if t in mine})
        v.with_fix_ok = bool(mine) and not bad and not any(test_file(t) in own.collect_errors for t in branch.tests)
        v.with_fix = ("pass" if v.with_fix_ok else "FAIL") + f" ({describe_outcomes(mine)})"
        if bad:
            v.with_fix += ": " + ", ".join(f"{t}: {o}" for t, o in sorted(bad.items()))
        attribute(
            branch,
            d,
            base_again if len(branches) > 1 else base_run,
            own if len(branches) > 1 else stacked_run,
            v,
            len(branches) > 1,
        )
        print(f"   {v.with_fix}; {clock(own)}", flush=True)
        problem = remove_fix(branch.worktree, branch.pr, branch.start)
        if problem:
            v.without_fix = problem
        else:
            without = runner.run(branch.worktree, f"{branch.pr.name}-without-fix", branch.tests, first_failure=True)
            mine = pr_tests_outcome(without, branch.tests)
            failed = sorted(f"{t.rpartition('::')[2]}: {o}" for t, o in mine.items() if o in BAD_OUTCOMES)
            failed += sorted(f"{t.rpartition('::')[2]}: left {w} changed" for t, w in without.leaks if t in mine)
            errors = sorted(without.collect_errors)
            v.without_fix_ok = bool(failed or errors)
            v.without_fix = (
                f"fail, as they must ({', '.join(failed + errors)})"
                if v.without_fix_ok
                else f"PASS: they do not show the bug ({describe_outcomes(mine)})"
            )
            print(f"   without its fix (its changes outside tests/ undone): {v.without_fix}", flush=True)
    unexplained = [t for t in d.changed if not any(t in c for v in verdicts.values() for c in v.changes)]
    gpu, gpu_ok = gpu_check(project, stacked, target.targets)
    print(summary(target, suite, base_run, stacked_run, d, unexplained, label))
    return tables(target, args, branches, verdicts, refused, unstacked, gpu, gpu_ok, made, started)


def tables(
    target: Target, args, branches, verdicts, refused, unstacked, gpu: str, gpu_ok, made: list[str], started
) -> int:
    """The branches made (all at once), one table per PR, in the stack's order; exit status 0 if all are ready."""
    set_branches(target, branches)
    made += [branch.name for branch in branches]
    ready = 0
    for pr in target.targets:
        branch = next((b for b in branches if b.pr is pr), None)
        if branch is None:
            name = branch_name(args, pr, len(target.targets) == 1)
            print(f"\nPR {pr.name}: branch {name} not made in {target.clone}\n  applies        no: {refused[pr.name]}")
            print("  ready to push  no (applies)", flush=True)
        else:
            ready += table(target, branch, verdicts[pr.name], gpu, gpu_ok, unstacked.get(pr.name))
    minutes = (time.monotonic() - started) / 60
    print(
        f"\n{ready} of {len(target.targets)} PR(s) ready to push ({minutes:.1f} min). Nothing was pushed; the "
        "clone's checkout and other branches are as they were."
    )
    return 0 if ready == len(target.targets) else 1


def attribute(branch: Branch, d: Diff, base: Run, own: Run, v: Verdict, rerun: bool) -> None:
    """What of the suite's difference this PR makes: existing tests whose outcome or leaks differ on its branch from
    the base (the reruns, or the suite runs themselves for a single PR), and the new tests in its files."""
    for test in sorted(set(d.changed) | {t for t, _ in [*d.leaks_added, *d.leaks_removed]}):
        if test not in base.outcomes or test not in own.outcomes:
            continue
        before, after = base.outcomes[test], own.outcomes[test]
        if before != after:
            v.changes.append(f"{test}: {before} -> {after}")
            v.changes_bad |= after in BAD_OUTCOMES
    for f in sorted(set(d.errors_added) | set(d.errors_removed)):
        now, then = f in own.collect_errors, f in base.collect_errors
        if now != then:
            v.changes.append(f"{f}: " + (f"does not collect: {own.collect_errors[f]}" if now else "collects again"))
            v.changes_bad |= now
    tests = set(base.outcomes) & set(own.outcomes)
    for (test, what), how in sorted(own.leaks.items()):
        if test in tests and (test, what) not in base.leaks:
            v.leaks.append(f"added: {test} ({what}: {how})")
            v.leaks_bad = True
    for (test, what), how in sorted(base.leaks.items()):
        if test in tests and (test, what) not in own.leaks and (rerun or (test, what) in d.leaks_removed):
            v.leaks.append(f"removed: {test} ({what})")
    new = {t: o for t, o in d.new.items() if test_file(t) in branch.files}
    for f, message in d.errors_added.items():
        if f in branch.added:
            v.changes.append(f"{f}: does not collect: {message}")
            v.changes_bad = True
    for (test, what), how in sorted(d.leaks_added.items()):
        if test in new:
            v.leaks.append(f"added: {test} ({what}: {how})")
            v.leaks_bad = True
    if new:
        v.new_tests = f"{len(new)} new in the suite ({describe_outcomes(new)})"
        bad = sorted(t for t, o in new.items() if o in BAD_OUTCOMES)
        if bad:
            v.changes.append("new tests failing in the suite: " + ", ".join(bad))
            v.changes_bad = True


def summary(target: Target, suite, base: Run, stacked: Run, d: Diff, unexplained: list[str], label: str) -> str:
    lines = [
        "",
        f"== upstream's {' '.join(suite)}: {target.base_label} against {label}",
        f"  {target.base_label}: {base.count()}; {clock(base)}",
        f"  {label}: {stacked.count()}; {clock(stacked)}",
    ]
    for f, message in sorted(stacked.collect_errors.items()):
        lines.append(f"  not collected on {label}: {f}: {message}")
    lines.append(
        f"  outcome changed: {len(d.changed)}" + "".join(f"\n    {t}: {a} -> {b}" for t, (a, b) in d.changed.items())
    )
    lines.append(f"  new tests: {len(d.new)}; tests gone: {len(d.gone)}")
    lines.append(
        f"  leaks: {len(base.leaks)} on {target.base_label}, {len(stacked.leaks)} on {label}; "
        f"added {len(d.leaks_added)}, removed {len(d.leaks_removed)}"
    )
    lines += [f"    added: {t} ({w}: {h})" for (t, w), h in d.leaks_added.items()]
    lines += [f"    removed: {t} ({w})" for t, w in d.leaks_removed]
    if unexplained:
        lines.append(
            "  changed only with the PRs stacked (not on any branch alone: order or flakiness): "
            + ", ".join(unexplained)
        )
    return "\n".join(lines)


def shortened(items: list[str], most: int = 3) -> str:
    """``items`` joined, the first ``most`` of them where there are more (all are in the summary above the tables)."""
    shown = "; ".join(items[:most])
    return shown + (f"; and {len(items) - most} more (listed above)" if len(items) > most else "")


def table(target: Target, branch: Branch, v: Verdict, gpu: str, gpu_ok: bool | None, unstacked: str | None) -> bool:
    applies = f"yes, on {target.base_label} (three-way); its tests {branch.test_home}"
    changes = shortened(v.changes) or "none"
    leaks = shortened(v.leaks) or "none added"
    if v.new_tests:
        changes += f" ({v.new_tests})" if v.changes else f"; {v.new_tests}"
    checks = {
        "applies": (f"only {unstacked}" if unstacked else applies, not unstacked),
        "tests with its fix": (v.with_fix, v.with_fix_ok),
        "tests without its fix": (v.without_fix, v.without_fix_ok),
        "upstream outcome changes": (changes, not v.changes_bad),
        "leaks": (leaks, not v.leaks_bad),
        "GPU": (gpu, gpu_ok is not False),
    }
    ready = all(ok for _, ok in checks.values())
    why = [name for name, (_, ok) in checks.items() if not ok]
    rows = [(name, text) for name, (text, _) in checks.items()]
    rows.append(("ready to push", "yes" if ready else f"no ({', '.join(why)})"))
    width = max(len(name) for name, _ in rows)
    lines = ["", f"PR {branch.pr.name}: branch {branch.name} of {target.clone}"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in rows]
    print("\n".join(lines), flush=True)
    return ready
