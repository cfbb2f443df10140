"""The commands (``build``, ``export``, ``check``, ``pr``, ``deps``) and the command line."""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .gitutil import (
    ForkError,
    PatchConflict,
    am_in_progress,
    contributor_env,
    contributor_identity,
    git,
    git_dir,
    git_env,
    parse_author,
    rev_parse,
    status_paths,
)
from .overlay import add_overlay, is_skipped, read_overlay
from .pr import write_pr_output
from .project import Project, Upstream, load_project
from .series import (
    OVERLAY_REF,
    apply_changes,
    apply_patches,
    lint_series,
    plan_changes,
    plan_export,
    read_series,
    unexported_changes,
)
from .sources import BASE_REF, FORK_BRANCH, create_pristine, obtain_sdist
from .stack import (
    LevelConflict,
    below,
    build_levels,
    independence_problems,
    load_stack,
    prs_of,
    run_level_tests,
    stack_problems,
)


TOOL_VERSION = "2"
STAMP_NAME = "workbench-stamp.json"
DEPS_STAMP_NAME = ".workbench-deps.json"
FORK_SCRIPT = "utils/fork.py"
OVERLAY_MESSAGE = "Overlay: the new files of every PR in the stack\n\nInternal commit of the workbench fork.\n"


def dirty_paths(cwd: Path) -> list[str]:
    """Uncommitted changes, ignoring build artifacts such as ``*.egg-info``."""
    return [p for p in status_paths(cwd) if not is_skipped(p)]


def inputs_hash(project: Project, upstream: Upstream) -> str:
    """Hash of everything a build of ``upstream``'s fork depends on: its pin entry, its series and its overlay."""
    h = hashlib.sha256()
    entry = project.config["upstreams"][upstream.name]
    h.update(f"tool {TOOL_VERSION}\0{json.dumps(entry, sort_keys=True)}\0".encode())
    series = read_series(upstream)
    h.update("\n".join(series).encode() + b"\0")
    for name in series:
        path = upstream.patches_dir / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>") + b"\0")
    for rel, (data, executable) in read_overlay(upstream).items():
        h.update(f"{rel}\0{int(executable)}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------------------
# Build stamp and editable install


def read_stamp(fork: Path) -> dict:
    try:
        return json.loads((git_dir(fork) / STAMP_NAME).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, ForkError):
        return {}


def write_stamp(fork: Path, **values) -> None:
    (git_dir(fork) / STAMP_NAME).write_text(json.dumps(values, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def clear_stamp(fork: Path) -> None:
    (git_dir(fork) / STAMP_NAME).unlink(missing_ok=True)


def venv_python(project: Project) -> Path:
    return project.venv / "bin" / "python"


def installed_editable_from(project: Project, upstream: Upstream) -> bool:
    """Whether the venv has the package installed in editable mode from its fork."""
    code = (
        "import importlib.metadata as m, sys\n"
        "try:\n    print(m.distribution(sys.argv[1]).read_text('direct_url.json') or '')\n"
        "except m.PackageNotFoundError:\n    pass\n"
    )
    proc = subprocess.run([venv_python(project), "-c", code, upstream.package], capture_output=True, text=True)
    try:
        info = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        return False
    return info.get("dir_info", {}).get("editable", False) and info.get("url") == upstream.fork_dir.resolve().as_uri()


def pip_install(project: Project, *args: str) -> None:
    cmd = [str(venv_python(project)), "-m", "pip", "install", *args]
    print("+ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise ForkError(f"pip install failed: {' '.join(cmd)}")


def install_forks(project: Project, upstreams: list[Upstream]) -> None:
    """``pip install -e`` the forks that are not installed editable from their folder yet (one pip run)."""
    if not venv_python(project).exists():
        raise ForkError(
            f"no virtual environment at {project.rel(project.venv)}: run `make fork`, or pass --no-install"
        )
    todo = [u for u in upstreams if not installed_editable_from(project, u)]
    if not todo:
        return
    packages = {u.package for u in project.upstreams.values()}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as constraints:
        pins = {name: version for name, version in project.pins.items() if name not in packages}
        constraints.write("".join(f"{name}=={version}\n" for name, version in pins.items()))
        constraints.flush()
        editable = [arg for u in todo for arg in ("-e", str(u.fork_dir))]
        pip_install(project, "-c", constraints.name, *editable)


# --------------------------------------------------------------------------------------------------------------
# build


def conflict_help(project: Project, upstream: Upstream, err: PatchConflict) -> str:
    return (
        f"{err.output}\n\n"
        f"Patch {project.rel(upstream.patches_dir / err.patch)} did not apply"
        + (f" to: {', '.join(err.files)}" if err.files else "")
        + f".\nThe fork is left in the middle of `git am` in {err.where}. To resolve:\n"
        f"  cd {err.where}\n"
        "  # fix the files, then: git add <files> && git am --continue   (or git am --skip / git am --abort)\n"
        f"  python {FORK_SCRIPT} export   # writes the resolved series back into the repository\n"
        "Pass -3 to `build` to let git try a three-way merge."
    )


def fork_losses(project: Project, upstream: Upstream, fork: Path, stamp: dict) -> list[str]:
    """Reasons why replacing ``fork`` would lose work; empty when it is safe."""
    if not (fork / ".git").exists():
        return [f"{fork} exists but is not a git repository"] if any(fork.iterdir()) else []
    if am_in_progress(fork):
        return [f"a `git am` is in progress in {fork} (finish it with `git am --continue`, then export)"]
    reasons = []
    dirty = dirty_paths(fork)
    if dirty:
        shown = ", ".join(dirty[:10]) + (" ..." if len(dirty) > 10 else "")
        reasons.append(f"{fork} has uncommitted changes: {shown}\n  Commit them inside the fork, then export.")
    head = rev_parse(fork, "HEAD")
    if head is not None and stamp.get("head") != head:
        if rev_parse(fork, BASE_REF) is None:
            reasons.append(f"{fork} has no '{BASE_REF}' tag, so its commits cannot be exported")
        else:
            changes = unexported_changes(project, upstream, fork)
            if changes:
                shown = "\n    ".join(changes[:10]) + ("\n    ..." if len(changes) > 10 else "")
                reasons.append(f"{fork} has commits that are not exported; export would:\n    {shown}")
    return reasons


def backup_path(fork: Path) -> Path:
    n = 1
    while (fork.parent / f"{fork.name}.backup-{n}").exists():
        n += 1
    return fork.parent / f"{fork.name}.backup-{n}"


def build_fork(project: Project, upstream: Upstream, args) -> None:
    """Pristine sdist (tag ``upstream-base``) + one overlay commit (tag ``workbench-overlay``) + the series."""
    fork = upstream.fork_dir
    inputs = inputs_hash(project, upstream)
    stamp = {}
    if fork.exists():
        is_repo = (fork / ".git").exists()
        stamp = read_stamp(fork) if is_repo else {}
        head = rev_parse(fork, "HEAD") if is_repo else None
        if is_repo and stamp.get("inputs") == inputs and stamp.get("head") == head and not am_in_progress(fork):
            print(f"{project.rel(fork)} is up to date (nothing to do)")
            return
        losses = fork_losses(project, upstream, fork, stamp)
        if losses and not args.force:
            raise ForkError(
                "refusing to rebuild, that would lose work:\n  "
                + "\n  ".join(losses)
                + f"\nRun `python {FORK_SCRIPT} export` (make patches) first, or pass --force "
                "(the old fork is then kept as a backup folder next to it)."
            )
        reuse = not losses and stamp.get("base_sha256") == upstream.sha256 and rev_parse(fork, BASE_REF) is not None
    else:
        losses, reuse = [], False

    if reuse:
        print(f"Resetting {project.rel(fork)} to '{BASE_REF}' ...", flush=True)
        clear_stamp(fork)
        git(fork, "checkout", "-q", "-f", "-B", FORK_BRANCH, BASE_REF)
        git(fork, "clean", "-q", "-f", "-d")
    else:
        sdist = obtain_sdist(project, upstream)
        fork.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=fork.parent, prefix=f".{fork.name}.new-")) / fork.name
        try:
            print(f"Unpacking {project.rel(sdist)} ...", flush=True)
            create_pristine(upstream, sdist, staging)
            if fork.exists():
                if losses:
                    backup = backup_path(fork)
                    fork.rename(backup)
                    print(f"Kept the old fork as {backup}")
                else:
                    shutil.rmtree(fork)
            staging.rename(fork)
        finally:
            shutil.rmtree(staging.parent, ignore_errors=True)
    add_overlay(fork, read_overlay(upstream), OVERLAY_MESSAGE)
    git(fork, "tag", "-f", OVERLAY_REF)
    try:
        apply_patches(upstream, fork, read_series(upstream), three_way=args.three_way)
    except PatchConflict as err:
        raise ForkError(conflict_help(project, upstream, err)) from None
    write_stamp(fork, base_sha256=upstream.sha256, inputs=inputs, head=rev_parse(fork, "HEAD"))
    count = len(read_series(upstream))
    print(f"Built {project.rel(fork)}: {upstream.label} + overlay + {count} patch(es)")


def cmd_build(project: Project, args) -> int:
    upstreams = project.select(args.upstream)
    if args.clone:
        return build_clone(project, args)
    for upstream in upstreams:
        build_fork(project, upstream, args)
    if not args.no_install:
        install_forks(project, upstreams)
    return 0


def clone_upstream(project: Project, clone: Path, names: list[str] | None) -> Upstream:
    """The upstream a contributor's clone is of: ``--upstream``, else the one whose package folder it holds."""
    if names:
        if len(names) != 1:
            raise ForkError("--clone takes one --upstream")
        return project.select(names)[0]
    found = [u for u in project.upstreams.values() if (clone / "src" / u.module).is_dir()]
    if len(found) != 1:
        raise ForkError(f"cannot tell which upstream {clone} is a clone of: pass --upstream NAME")
    return found[0]


def build_clone(project: Project, args) -> int:
    """The stack's PRs for one upstream on a new branch of the contributor's clone, authored by the contributor:
    each PR's new files in one commit, then its patches (as ``make pr`` writes them)."""
    clone = Path(args.clone).resolve()
    if not (clone / ".git").exists():
        raise ForkError(f"{clone} is not a git clone")
    upstream = clone_upstream(project, clone, args.upstream)
    name, email = parse_author(args.author) if args.author else contributor_identity(clone, "build --clone")
    env = contributor_env(name, email)
    prs = load_stack(project)
    problems = stack_problems(project, prs)
    if problems:
        raise ForkError("the stack is not consistent (run `make check`):\n  " + "\n  ".join(problems))
    own = prs_of(prs, upstream)
    if not own:
        raise ForkError(f"the stack has no PR for {upstream.name}")
    if args.pr:
        matches = [pr for pr in own if pr.name == args.pr]
        if not matches:
            raise ForkError(f"--pr {args.pr}: no {upstream.name} PR of that name ({', '.join(p.name for p in own)})")
        target = matches[0]
    else:
        target = own[-1]
    levels = [*below(prs, target), target]
    if am_in_progress(clone):
        raise ForkError(f"a `git am` is in progress in {clone}; finish or abort it first")
    dirty = dirty_paths(clone)
    if dirty:
        raise ForkError(f"{clone} has uncommitted changes ({', '.join(dirty[:10])}); commit or stash them first")
    branch = args.branch or target.name
    if rev_parse(clone, f"refs/heads/{branch}") is not None and not args.force:
        raise ForkError(f"branch {branch} exists in {clone}; pass --branch NAME or --force to reset it")
    user_env = dict(env)
    for key in ("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL"):  # the contributor's own git settings apply here
        user_env.pop(key, None)
    git(clone, "checkout", "-q", "-B", branch, env=user_env)
    overlay = read_overlay(upstream)
    for pr in levels:
        add_overlay(clone, {rel: overlay[rel] for rel in pr.overlay if rel in overlay}, pr.commit_message(), user_env)
        try:
            apply_patches(upstream, clone, pr.patches, three_way=args.three_way, env=user_env, reset_author=True)
        except PatchConflict as err:
            raise ForkError(f"PR {pr.name}: " + conflict_help(project, upstream, err)) from None
    print(f"Branch {branch} of {clone} now holds {', '.join(p.name for p in levels)}, authored by {name} <{email}>.")
    print(f"Run the tests there, push the branch and open the PR with dist/{target.folder}/PR_DESCRIPTION.md.")
    return 0


# --------------------------------------------------------------------------------------------------------------
# export


def unsaved_repo_files(project: Project, paths: list[Path], exported: dict[str, str]) -> list[str]:
    """Existing files among ``paths`` whose content exists nowhere else: not committed in the repository's git and
    not what an earlier export wrote. Outside a git repository every existing file counts as unsaved."""
    existing = [project.rel(p) for p in paths if p.is_file()]
    if not existing:
        return []
    proc = subprocess.run(
        ["git", "status", "--porcelain", "-z", "--untracked-files=all", "--", *existing],
        cwd=project.root,
        env=git_env(),
        capture_output=True,
    )
    if proc.returncode != 0:
        dirty = set(existing)
    else:
        entries = [e for e in proc.stdout.decode(errors="replace").split("\0") if e]
        dirty = {e[3:] for e in entries if len(e) > 3}
    return [
        rel
        for rel in existing
        if rel in dirty and exported.get(rel) != sha256_bytes((project.root / rel).read_bytes())
    ]


def export_fork(project: Project, upstream: Upstream, force: bool) -> None:
    fork = upstream.fork_dir
    if am_in_progress(fork):
        raise ForkError(f"a `git am` is in progress in {fork}; finish it (git am --continue) before exporting")
    dirty = dirty_paths(fork)
    if dirty:
        raise ForkError(
            f"{fork} has uncommitted changes ({', '.join(dirty[:10])}): commit them inside the fork, then export"
        )
    plan = plan_export(upstream, fork)
    changes = plan_changes(upstream, plan)
    conflicts = [project.rel(path) for action, path, _, _ in changes if action == "conflict"]
    if conflicts and not force:
        raise ForkError(
            "these overlay files changed both in the repository (since the fork was built) and in the fork:\n  "
            + "\n  ".join(conflicts)
            + "\nBring the repository's changes into the fork and commit them there, then export; "
            "or pass --force to take the fork's version."
        )
    changes = [  # with --force, a conflict takes the fork's version
        (("write" if data is not None else "delete") if action == "conflict" else action, path, data, executable)
        for action, path, data, executable in changes
    ]
    stamp = read_stamp(fork)
    at_risk = unsaved_repo_files(project, [path for _, path, _, _ in changes], stamp.get("exported", {}))
    if at_risk and not force:
        raise ForkError(
            "export would overwrite or delete repository files whose changes are not committed in the repository"
            " (and did not come from an earlier export):\n  "
            + "\n  ".join(at_risk)
            + "\nCommit them in the repository, or copy them into the fork and commit them there; "
            "or pass --force to overwrite them."
        )
    apply_changes(project, changes)
    for action, path, _, _ in changes:
        print(f"{'wrote' if action == 'write' else 'deleted'} {project.rel(path)}")
    if not changes:
        print(f"Nothing to export from {project.rel(fork)}: the repository matches the fork")
    exported = {project.rel(upstream.repo_dir / rel): sha256_bytes(data) for rel, (data, _) in plan.overlay.items()}
    exported.update({project.rel(upstream.patches_dir / n): sha256_bytes(data) for n, data in plan.patches})
    exported[project.rel(upstream.series_file)] = sha256_bytes(plan.series_text)
    write_stamp(
        fork,
        base_sha256=stamp.get("base_sha256"),
        inputs=inputs_hash(project, upstream),
        head=rev_parse(fork, "HEAD"),
        exported=exported,
    )


def cmd_export(project: Project, args) -> int:
    upstreams = project.select(args.upstream)
    missing = [u for u in upstreams if not (u.fork_dir / ".git").exists()]
    if missing and (args.upstream or len(missing) == len(upstreams)):
        raise ForkError(f"no fork at {', '.join(project.rel(u.fork_dir) for u in missing)}: run `make fork` first")
    for upstream in upstreams:
        if upstream in missing:
            print(f"Skipping {upstream.name}: no fork at {project.rel(upstream.fork_dir)}")
            continue
        export_fork(project, upstream, args.force)
    if project.stack_path.is_file():
        try:
            notes = stack_problems(project, load_stack(project))
        except ForkError as err:
            notes = [str(err)]
        for note in notes:
            print(f"note: {note}")
        if notes:
            print(f"note: update {project.rel(project.stack_path)} so that `make check` passes")
    return 0


# --------------------------------------------------------------------------------------------------------------
# check


def covered_by_repo_tests(project: Project, upstream: Upstream, test: str) -> bool:
    """Whether the repository's own ``pytest tests`` run collects ``test`` (an overlay test file in ``tests/``)."""
    path = (upstream.repo_dir / test.split("::")[0]).resolve()
    return path.is_relative_to(project.root / "tests") and path.exists()


def check_upstream(project: Project, upstream: Upstream, prs, tmp: Path, args) -> list[str]:
    """Build ``upstream``'s levels (or, when the stack is unusable, overlay + series), compare with the repository,
    run each PR's tests at its level. Returns the problems."""
    repo = tmp / upstream.name
    try:
        if prs is not None:
            build_levels(project, upstream, prs, repo)
        else:
            create_pristine(upstream, obtain_sdist(project, upstream), repo)
            add_overlay(repo, read_overlay(upstream), OVERLAY_MESSAGE)
            apply_patches(upstream, repo, read_series(upstream))
    except LevelConflict as err:
        return [str(err)]
    except PatchConflict as err:
        where = f": {', '.join(err.files)}" if err.files else ""
        return [
            f"{project.rel(upstream.patches_dir / err.patch)} does not apply cleanly to {upstream.label}{where}\n"
            "  git said:\n    "
            + "\n    ".join(err.output.splitlines()[-8:])
            + "\n  Fix it with `build -3` in the fork, `git am --continue`, then `export`."
        ]
    problems = [
        f"re-exporting would {change} (run `make fork`, then `make patches`)"
        for change in unexported_changes(project, upstream, repo)
    ]
    if prs is not None and not problems:
        problems += independence_problems(project, upstream, repo, prs)
    if problems or prs is None or not args.tests:
        return problems
    own = prs_of(prs, upstream)
    pytest_args = args.pytest_args.split() if args.pytest_args else []
    for pr in own:
        tests = pr.tests
        if pr is own[-1] and args.skip_repo_tests_at_top:
            tests = [t for t in tests if not covered_by_repo_tests(project, upstream, t)]
            if not tests:
                print(f"\n== PR {pr.name}: top of {upstream.name}, its tests run in the repository's test run")
                continue
        problem = run_level_tests(project, upstream, repo, prs, pr, tests, tmp, pytest_args)
        if problem:
            problems.append(problem)
    return problems


def cmd_check(project: Project, args) -> int:
    problems = []
    for upstream in project.upstreams.values():
        problems += lint_series(project, upstream)
    try:
        prs = load_stack(project)
    except ForkError as err:
        problems.append(str(err))
        prs = None
    if prs is not None:
        stack = stack_problems(project, prs)
        problems += stack
        if stack:
            prs = None  # still check that the series applies and is exported, without levels
    buildable = [
        u
        for u in project.upstreams.values()
        if all((u.patches_dir / name).is_file() for name in read_series(u))
        and (prs is None or all((u.patches_dir / n).is_file() for pr in prs_of(prs, u) for n in pr.patches))
    ]
    with tempfile.TemporaryDirectory(prefix="fork-check-") as tmp:
        for upstream in buildable:
            problems += check_upstream(project, upstream, prs, Path(tmp), args)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if problems:
        return 1
    for upstream in project.upstreams.values():
        names = [pr.name for pr in prs_of(prs, upstream)]
        print(
            f"OK: {upstream.label}: {len(read_series(upstream))} patch(es) in {len(names)} PR(s) "
            f"({', '.join(names) or 'none'}) apply level by level and are exported"
            + ("; each PR's tests pass at its level" if args.tests and names else "")
        )
    return 0


# --------------------------------------------------------------------------------------------------------------
# pr


def cmd_pr(project: Project, args) -> int:
    name, email = parse_author(args.author) if args.author else contributor_identity(project.root, "make pr")
    prs = load_stack(project)
    problems = stack_problems(project, prs)
    for upstream in project.upstreams.values():
        problems += lint_series(project, upstream)
    if problems:
        raise ForkError("the stack is not consistent, nothing written (run `make check`):\n  " + "\n  ".join(problems))
    out = Path(args.out).resolve() if args.out else project.root / "dist"
    toc = write_pr_output(project, prs, out, name, email)
    for pr in prs:
        count = len(list((out / pr.folder).glob("*.patch")))
        print(f"wrote {project.rel(out / pr.folder)}/: {count} patch(es) + PR_DESCRIPTION.md ({pr.upstream})")
    print(f"wrote {project.rel(out / 'README.md')} (the stack: order, levels, files)")
    print(f"Authored by {name} <{email}>. Apply a folder onto its level with `git am <folder>/*.patch`.")
    if toc:
        print("\n" + "\n".join(toc))
    return 0


# --------------------------------------------------------------------------------------------------------------
# deps


def cmd_deps(project: Project, args) -> int:
    """Install the pinned tools into the venv (torch first), skipped when the pins did not change."""
    if not venv_python(project).exists():
        raise ForkError(f"no virtual environment at {project.venv}: create it with `python3 -m venv {project.venv}`")
    pins = project.pins
    key = hashlib.sha256(json.dumps({"tool": TOOL_VERSION, "pins": pins}, sort_keys=True).encode()).hexdigest()
    stamp = project.venv / DEPS_STAMP_NAME
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == key:
        print("Pinned tools are installed (nothing to do)")
        return 0
    specs = [f"{name}=={version}" for name, version in pins.items()]
    if "torch" in pins:
        pip_install(project, f"torch=={pins['torch']}")
    if specs:
        pip_install(project, *specs)
    stamp.write_text(key + "\n", encoding="utf-8")
    return 0


# --------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo-root", help="root of the workbench repository (default: the one holding utils/)")
    common.add_argument("--config", help="pin file (default: REPO/patches/config.json)")
    common.add_argument(
        "--upstream", action="append", help="work on this upstream only (repeatable; default: all of them)"
    )
    common.add_argument("--fork-dir", help="the fork (with one --upstream; default: its `fork` in the pin file)")
    common.add_argument(
        "--sdist",
        action="append",
        help="[UPSTREAM=]PATH: use this local sdist instead of the cache or the package index (sha-checked)",
    )
    common.add_argument("--venv", help="virtual environment (default: REPO/.venv)")

    parser = argparse.ArgumentParser(
        description=PACKAGE_DOC.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", parents=[common], help="build the forks (a fast no-op when nothing changed)")
    build.add_argument("--clone", help="put the stack's PRs on a new branch of this contributor's upstream clone")
    build.add_argument("--pr", help="with --clone: stop at this PR (default: the top one of that upstream)")
    build.add_argument("--branch", help="branch to create with --clone (default: the PR's name)")
    build.add_argument("--author", help="with --clone: 'Name <email>' (default: git's user.name and user.email)")
    build.add_argument("-3", "--3way", dest="three_way", action="store_true", help="let git am do three-way merges")
    build.add_argument(
        "--force", action="store_true", help="rebuild even when the fork has unexported work (kept as a backup)"
    )
    build.add_argument("--no-install", action="store_true", help="skip the editable pip install into the venv")
    export = sub.add_parser("export", parents=[common], help="write the forks' commits back as overlay and patches")
    export.add_argument("--force", action="store_true", help="overwrite repository files with uncommitted changes")
    check = sub.add_parser("check", parents=[common], help="verify the stack: levels apply, exported, tests pass")
    check.add_argument("--tests", action="store_true", help="run each PR's own tests at its level")
    check.add_argument(
        "--skip-repo-tests-at-top",
        action="store_true",
        help="at the top level of an upstream (the installed fork) leave out the tests the repository's own "
        "`pytest tests` runs (make test does both)",
    )
    check.add_argument("--pytest-args", default="", help="extra pytest arguments for the level tests, e.g. '-n auto'")
    pr = sub.add_parser("pr", parents=[common], help="write one folder per PR of the stack to dist/")
    pr.add_argument("--out", help="output folder (default: REPO/dist)")
    pr.add_argument("--author", help="'Name <email>' (default: git's user.name and user.email)")
    sub.add_parser("deps", parents=[common], help="install the pinned tools into the venv (torch first)")
    return parser.parse_args(argv)


def split_sdists(values: list[str] | None, project_names: list[str], selected: list[str] | None) -> dict[str, Path]:
    result = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or name not in project_names:
            targets = selected or project_names
            if len(targets) != 1:
                raise ForkError(f"--sdist {value}: say which upstream it is for, as UPSTREAM=PATH")
            name, path = targets[0], value
        result[name] = Path(path).resolve()
    return result


def make_project(args) -> Project:
    root = Path(args.repo_root).resolve() if args.repo_root else Path(__file__).resolve().parents[2]
    config = Path(args.config).resolve() if args.config else None
    venv = Path(args.venv).resolve() if args.venv else None
    project = load_project(root, config, venv)
    names = list(project.upstreams)
    fork_dirs = {}
    if args.fork_dir:
        if not args.upstream and len(names) > 1:
            raise ForkError("--fork-dir needs --upstream NAME (there are several upstreams)")
        fork_dirs[(args.upstream or names)[0]] = Path(args.fork_dir).resolve()
    sdists = split_sdists(args.sdist, names, args.upstream)
    return load_project(root, config, venv, fork_dirs=fork_dirs, sdists=sdists)


COMMANDS = {"build": cmd_build, "export": cmd_export, "check": cmd_check, "pr": cmd_pr, "deps": cmd_deps}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return COMMANDS[args.command](make_project(args), args)
    except ForkError as err:
        print(f"fork.py {args.command}: error: {err}", file=sys.stderr)
        return 1
