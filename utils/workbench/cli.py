"""The command line: ``build`` and ``export`` (forks.py), ``check`` (the whole stack), ``pr`` (dist/), ``deps``."""

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .args import Parser
from .clonevenv import cmd_clone_venv
from .forks import (
    OVERLAY_MESSAGE,
    TOOL_VERSION,
    cmd_build,
    cmd_export,
    pip_install,
    requirement_problems,
    venv_python,
)
from .gitutil import ForkError, PatchConflict, contributor_identity, parse_author
from .opener import cmd_open
from .overlay import add_overlay, read_overlay
from .pr import ISSUES_OUT, write_pr_output
from .project import Project, Upstream, load_project
from .repros import verify_texts
from .series import apply_patches, lint_series, read_series, stale_patches
from .sources import create_pristine, obtain_sdist
from .stack import (
    LevelConflict,
    build_levels,
    load_stack,
    pr_test_results,
    prs_of,
    stack_problems,
    stock_sources,
)
from .testenv import pytest_options
from .texts import text_problems, word_counts
from .upgrade import cmd_upgrade, interrupted_upgrade


DEPS_STAMP_NAME = ".workbench-deps.json"


# --------------------------------------------------------------------------------------------------------------
# check


def check_upstream(project: Project, upstream: Upstream, prs, tmp: Path, args, stock: dict) -> list[str]:
    """Build ``upstream``'s levels (or, when the stack is unusable, overlay + series), compare with the repository,
    run each PR's tests at its level, with the pristine sources of the other upstreams (``stock``) first on the path.
    Returns the problems."""
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
    moved, other = stale_patches(project, upstream, repo)
    problems = [f"re-exporting would {change} (run `make fork`, then `make patches`)" for change in other]
    problems += [
        f"{path} is stale only in its `index` lines and `@@` line numbers (the {upstream.label} base moved under it): "
        "run `make patches` to rewrite it"
        for path in moved
    ]
    if other or prs is None or not args.tests:  # a patch that only moved is the same change: its PR's tests run
        return problems
    results = pr_test_results(project, upstream, repo, prs, tmp, args.pytest_args, stock)
    return problems + [problem for pair in results.values() for problem in pair if problem]


def cmd_check(project: Project, args) -> int:
    problems = []
    problems += text_problems(project)  # the PR descriptions and issue drafts (texts.py)
    if args.tests:  # the tests run in the venv: it holds what the pinned releases require
        problems += requirement_problems(project)
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
        stock = stock_sources(project, Path(tmp)) if args.tests and prs is not None else {}
        for upstream in buildable:
            problems += check_upstream(project, upstream, prs, Path(tmp), args, stock)
        # The texts' reproductions, run on the releases and the fork, and their quotes of upstream (repros.py)
        texts_found, texts_ok = verify_texts(project, Path(tmp), stock) if args.tests else ([], None)
        problems += texts_found
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if problems:
        return 1
    for upstream in project.upstreams.values():
        names = [pr.name for pr in prs_of(prs, upstream)]
        print(
            f"OK: {upstream.label}: {len(read_series(upstream))} patch(es) in {len(names)} PR(s) "
            f"({', '.join(names) or 'none'}) apply one after the other and each on its own level, and are exported"
            + ("; each PR's tests pass at its level and fail without its fix" if args.tests and names else "")
        )
    if texts_ok:
        print(texts_ok)
    return 0


# --------------------------------------------------------------------------------------------------------------
# pr


def cmd_pr(project: Project, args) -> int:
    name, email = parse_author(args.author) if args.author else contributor_identity(project.root, "make pr")
    prs = load_stack(project)
    problems = stack_problems(project, prs)
    for upstream in project.upstreams.values():
        problems += lint_series(project, upstream)
    problems += text_problems(project)
    if problems:
        raise ForkError("the stack is not consistent, nothing written (run `make check`):\n  " + "\n  ".join(problems))
    out = Path(args.out).resolve() if args.out else project.root / "dist"
    toc = write_pr_output(project, prs, out, name, email)
    for pr in prs:
        count = len(list((out / pr.folder).glob("*.patch")))
        first = f", after the issue {Path(pr.issue_first).name}" if pr.issue_first else ""
        print(f"wrote {project.rel(out / pr.folder)}/: {count} patch(es) + PR_DESCRIPTION.md ({pr.upstream}{first})")
    issues = sorted((out / ISSUES_OUT).glob("*.md"))
    if issues:
        print(f"wrote {project.rel(out / ISSUES_OUT)}/: {', '.join(p.name for p in issues)} (issue drafts)")
    print(
        f"wrote {project.rel(out / 'README.md')} (read it first: how these were made, and what to do before opening)"
    )
    print(f"Authored by {name} <{email}>. Apply a folder onto its level with `git am <folder>/*.patch`.")
    print("\nProse words (outside code blocks) per text, and the limit `make check` enforces:")
    for path, words, limit in word_counts(project):
        print(f"  {words:4d} / {limit}  {path}")
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

    parser = Parser(description=PACKAGE_DOC.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", parents=[common], help="build the forks (a fast no-op when nothing changed)")
    build.add_argument("--clone", help="put the stack's PRs on a new branch of this contributor's upstream clone")
    build.add_argument("--pr", help="with --clone: stop at this PR (default: the top one of that upstream)")
    build.add_argument("--base", help="with --clone: the branch starts here (default: the clone's main)")
    build.add_argument("--branch", help="branch to create with --clone (default: the PR's name)")
    build.add_argument("--author", help="with --clone: 'Name <email>' (default: git's user.name and user.email)")
    build.add_argument("-3", "--3way", dest="three_way", action="store_true", help="let git am do three-way merges")
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild even when up to date, or when the fork has unexported work (kept as a backup)",
    )
    build.add_argument("--no-install", action="store_true", help="skip the editable pip install into the venv")
    export = sub.add_parser("export", parents=[common], help="write the forks' commits back as overlay and patches")
    export.add_argument("--force", action="store_true", help="overwrite repository files with uncommitted changes")
    check = sub.add_parser("check", parents=[common], help="verify the stack: levels apply, exported, tests pass")
    check.add_argument("--tests", action="store_true", help="run each PR's own tests at its level")
    check.add_argument(
        "--pytest-args",
        default="",
        type=pytest_options,
        help="extra pytest arguments for the level tests, e.g. '-n auto'",
    )
    pr = sub.add_parser("pr", parents=[common], help="write one folder per PR of the stack to dist/")
    pr.add_argument("--out", help="output folder (default: REPO/dist)")
    pr.add_argument("--author", help="'Name <email>' (default: git's user.name and user.email)")
    opener = sub.add_parser(
        "open", parents=[common], help="each PR on a branch of your clone of upstream main, proven there (make open)"
    )
    opener.add_argument("--clone", required=True, help="your clone of upstream (its main is the base)")
    opener.add_argument("--pr", help="only this PR (default: every PR of the clone's upstream)")
    opener.add_argument("--base", help="the branches start here (default: the clone's main)")
    opener.add_argument("--branch", help="with --pr: the branch's name (default: the PR's name)")
    opener.add_argument("--author", help="'Name <email>' (default: git's user.name and user.email)")
    opener.add_argument("--force", action="store_true", help="make the PR branches again where they exist")
    opener.add_argument(
        "--keep-conflict", action="store_true", help="on a conflict, leave the branch in `git am` in a worktree"
    )
    opener.add_argument("--suite", action="append", help="upstream's tests to run (default: tests/trainer)")
    opener.add_argument("--workers", default="auto", help="pytest -n for upstream's suite (default auto; 0: none)")
    opener.add_argument(  # checked by the --venv's pytest in the clone (its plugins, its conftest.py's options)
        "--pytest-args", default="", help="extra pytest arguments for every run, e.g. '--timeout 900'"
    )
    clone_venv = sub.add_parser(
        "clone-venv", parents=[common], help="a venv with a clone's own test dependencies, for `open --venv`"
    )
    clone_venv.add_argument("--clone", required=True, help="your clone of upstream (its declared requirements)")
    clone_venv.add_argument("--out", required=True, help="the venv to make (absent, empty, or made by clone-venv)")
    clone_venv.add_argument("--suite", action="append", help="upstream's tests to collect (default: tests/trainer)")
    sub.add_parser("deps", parents=[common], help="install the pinned tools into the venv (torch first)")
    upgrade = sub.add_parser(
        "upgrade", parents=[common], help="move the forks and the stack to new releases (default: the newest)"
    )
    upgrade.add_argument("--transformers", help="the transformers version (default: the newest on the index)")
    upgrade.add_argument("--accelerate", help="the accelerate version (default: the newest on the index)")
    upgrade.add_argument(
        "--pytest-args",
        default="",
        type=pytest_options,
        help="extra pytest arguments for the level tests, e.g. '-n auto'",
    )
    upgrade.add_argument("--no-install", action="store_true", help="skip the editable pip install into the venv")
    upgrade.add_argument("--allow-older", action="store_true", help="allow moving to a release older than the pinned")
    upgrade.add_argument("--force", action="store_true", help="rebuild and retest even when already on those releases")
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


COMMANDS = {
    "build": cmd_build,
    "export": cmd_export,
    "check": cmd_check,
    "pr": cmd_pr,
    "deps": cmd_deps,
    "upgrade": cmd_upgrade,
    "open": cmd_open,
    "clone-venv": cmd_clone_venv,
}


# What an interrupted command left (its temporary folders are removed on the way out), and how to go on.
INTERRUPTED = {
    "build": lambda project, args: (
        "run `make fork` again (with FORK_ARGS=--force where it refuses a fork left half-built: "
        "the old one is kept as a backup folder)"
    ),
    "check": lambda project, args: (
        "nothing was changed (the levels were built in a temporary folder); run `make check` again"
    ),
    "deps": lambda project, args: "run `make deps` again: pip installs what is missing",
    "clone-venv": lambda project, args: (
        "the venv is left as far as it got; run the same command again: it goes on there"
    ),
    "upgrade": interrupted_upgrade,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    project = None
    try:
        project = make_project(args)
        return COMMANDS[args.command](project, args)
    except ForkError as err:
        print(f"fork.py {args.command}: error: {err}", file=sys.stderr)
        return getattr(err, "status", 1)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (the subprocesses got it too and stop quietly)
        said = INTERRUPTED.get(args.command)
        left = said(project, args) if said and project else f"run `fork.py {args.command}` again"
        print(f"\nfork.py {args.command}: interrupted: {left}.", file=sys.stderr, flush=True)
        return 130
