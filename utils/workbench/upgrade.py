"""``upgrade``: move the forks and the stack to new upstream releases in one command.

Stages: find the releases (the newest on the package index unless named; an older one than the pinned only with
``--allow-older``; already pinned: nothing to do, unless ``--force``), download their sdists (a temporary folder,
then the cache) and hash them, unpack the new bases (each checked against its own version), rebuild each fork on its
new base with every PR re-applied three-way (``git am -3``, the previous stack's blobs fetched into the fork so that
git can merge), re-export (a patch stale only in its ``index`` lines and offsets is rewritten), write the pin file,
install the forks and the stock sources, and run each PR's tests at its level with its fix and without it. One row per
PR says whether it applies (or where it conflicts: that fork is left in the middle of ``git am``), and how its tests
came out; a PR whose tests pass on the new release without its fix is possibly fixed upstream, shown with the upstream
files that changed under it. While a PR conflicts, the venv and the stock sources stay on the previous releases, and
the way back to them is printed. The exit status is 0 only when the stack is ready (or already up to date).
"""

import copy
import json
import re
import shutil
import tempfile
from pathlib import Path

from .forks import OVERLAY_MESSAGE, export_fork, fork_losses, inputs_hash, install_forks, read_stamp, write_stamp
from .gitutil import BadInput, ForkError, PatchConflict, git, rev_parse
from .overlay import add_overlay, read_overlay
from .project import Project, load_project
from .series import OVERLAY_REF, apply_patches, read_series
from .sources import (
    BASE_REF,
    build_stock,
    create_pristine,
    download_sdist,
    index_versions,
    obtain_sdist,
    sha256_file,
    stock_dir,
)
from .stack import (
    PR,
    LevelConflict,
    PassesWithoutFix,
    build_levels,
    load_stack,
    pr_test_results,
    prs_of,
    stack_problems,
    stock_sources,
)


PREVIOUS_BASE = "previous-base"
STAGES = 6


def stage(number: int, what: str) -> None:
    print(f"\n[{number}/{STAGES}] {what}", flush=True)


def release_key(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``5.25.0`` -> ``(5, 25, 0)``), to tell an older release from a newer one."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def target_versions(project: Project, wanted: dict[str, str | None], allow_older: bool = False) -> dict[str, str]:
    """The version each upstream moves to: the one asked for, which must exist (and, without ``allow_older``, not be
    older than the pinned one), or the newest on the index."""
    targets = {}
    for upstream in project.upstreams.values():
        releases = index_versions(upstream.package)
        version = wanted.get(upstream.name) or releases[0]
        if version not in releases:
            raise BadInput(
                f"{upstream.package} {version} is not a release on the package index (newest: {releases[0]}); "
                "nothing was changed"
            )
        if release_key(version) < release_key(upstream.version) and not allow_older:
            raise BadInput(
                f"{upstream.package} {version} is older than the pinned {upstream.version}: moving back needs "
                "--allow-older (make upgrade ... UPGRADE_ARGS=--allow-older); nothing was changed"
            )
        targets[upstream.name] = version
        print(f"  {upstream.name}: {upstream.version} -> {version}", flush=True)
    return targets


def download(project: Project, targets: dict[str, str]) -> dict[str, str]:
    """Download each target sdist into a temporary folder, hash it, then keep it in the cache: ``{name: sha256}``."""
    hashes = {}
    for upstream in project.upstreams.values():
        version = targets[upstream.name]
        with tempfile.TemporaryDirectory(prefix="fork-upgrade-") as tmp:
            fresh = download_sdist(project, upstream.package, version, Path(tmp))
            hashes[upstream.name] = sha256_file(fresh)
            upstream.cache_dir.mkdir(parents=True, exist_ok=True)
            shutil.move(fresh, upstream.cache_dir / f"{upstream.package}-{version}.tar.gz")
        print(f"  {upstream.package} {version}: sha256 {hashes[upstream.name]}", flush=True)
    return hashes


def pin_text(config: dict) -> str:
    """The pin file as written: two-space JSON, short lists of strings on one line."""
    text = json.dumps(config, indent=2)
    return (
        re.sub(r"\[\n\s+([^\[\]{}]*?)\n\s*\]", lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]", text) + "\n"
    )


def conflict_row(fork: Path, err: PatchConflict) -> str:
    """Where a PR conflicts: each file, with the count of conflicted hunks ``git am -3`` left in it."""
    parts = []
    for rel in err.files or ["(see git's output)"]:
        path = fork / rel
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        hunks = len(re.findall(r"^<<<<<<< ", text, flags=re.MULTILINE))
        parts.append(f"{rel} ({hunks} hunk{'s' if hunks != 1 else ''})" if hunks else rel)
    return f"CONFLICT in {err.patch}: " + ", ".join(parts)


def previous_stack(project: Project, upstream, scratch: Path) -> Path:
    """The stack on its previous base, in a scratch repository: the blobs ``git am -3`` merges from."""
    repo = scratch / f"previous-{upstream.name}"
    create_pristine(upstream, obtain_sdist(project, upstream), repo)
    add_overlay(repo, read_overlay(upstream), OVERLAY_MESSAGE)
    try:
        apply_patches(upstream, repo, read_series(upstream))
    except PatchConflict:
        git(repo, "am", "--abort", check=False)
    return repo


def patched_files(upstream, pr: PR) -> list[str]:
    """The upstream files a PR's patches (and its mutation) change."""
    files = [pr.mutation[0]] if pr.mutation else []
    for name in pr.patches:
        text = (upstream.patches_dir / name).read_text(encoding="utf-8", errors="replace")
        files += re.findall(r"^diff --git a/(\S+) b/", text, flags=re.MULTILINE)
    return sorted(set(files))


def cmd_upgrade(project: Project, args) -> int:
    prs = load_stack(project)
    problems = stack_problems(project, prs)
    for upstream in project.upstreams.values():
        fork = upstream.fork_dir
        if fork.exists():
            problems += fork_losses(project, upstream, fork, read_stamp(fork))
    if problems:
        raise ForkError("nothing was changed:\n  " + "\n  ".join(problems) + "\nExport or fix these first.")

    stage(1, "Finding the releases on the package index")
    wanted = {name: getattr(args, name, None) for name in project.upstreams}
    targets = target_versions(project, wanted, allow_older=args.allow_older)
    if all(targets[name] == u.version for name, u in project.upstreams.items()) and not args.force:
        newest = "" if any(wanted.values()) else " (the newest on the package index)"
        labels = " and ".join(u.label for u in project.upstreams.values())
        print(
            f"\nAlready up to date: the pins are {labels}{newest}; nothing was changed (--force rebuilds and retests)."
        )
        return 0
    written = written_paths(project)
    uncommitted = uncommitted_paths(project, written)
    if uncommitted:
        raise ForkError(
            "nothing was changed: upgrade rewrites these, which have uncommitted changes: "
            + ", ".join(uncommitted)
            + "\nCommit or stash them first."
        )
    stage(2, "Downloading and hashing the sdists")
    hashes = download(project, targets)
    config = copy.deepcopy(project.config)
    for name, entry in config["upstreams"].items():
        entry.pop("sdist", None)
        entry.update(version=targets[name], sha256=hashes[name])
    new = load_project(
        project.root,
        project.config_path,
        project.venv,
        fork_dirs={n: u.fork_dir for n, u in project.upstreams.items()},
        config=config,
    )

    stage(3, "Building the forks on the new releases, every PR re-applied three-way")
    rows = {pr.name: {"applies": "not tried", "with": "-", "without": "-"} for pr in prs}
    conflicted = []
    with tempfile.TemporaryDirectory(prefix="fork-upgrade-") as tmp:
        staged = {}
        try:
            for name, upstream in new.upstreams.items():  # every new base first: a refused one changes nothing
                upstream.fork_dir.parent.mkdir(parents=True, exist_ok=True)
                staged[name] = Path(tempfile.mkdtemp(dir=upstream.fork_dir.parent, prefix=f".{name}.upgrade-"))
                create_pristine(upstream, obtain_sdist(new, upstream), staged[name] / name)
                previous = previous_stack(project, project.upstreams[name], Path(tmp))
                refs = [f"+refs/tags/upstream-base:refs/tags/{PREVIOUS_BASE}", "+HEAD:refs/tags/previous-stack"]
                git(staged[name] / name, "fetch", "-q", "--no-tags", str(previous), *refs)
            for name, upstream in new.upstreams.items():
                shutil.rmtree(upstream.fork_dir, ignore_errors=True)
                (staged[name] / name).rename(upstream.fork_dir)
        finally:
            for folder in staged.values():
                shutil.rmtree(folder, ignore_errors=True)
        for name, upstream in new.upstreams.items():
            fork = upstream.fork_dir
            add_overlay(fork, read_overlay(upstream), OVERLAY_MESSAGE)
            git(fork, "tag", "-f", OVERLAY_REF)
            for pr in prs_of(prs, upstream):
                try:
                    apply_patches(upstream, fork, pr.patches, three_way=True)
                except PatchConflict as err:
                    rows[pr.name]["applies"] = conflict_row(fork, err)
                    conflicted.append((upstream, err))
                    break
                rows[pr.name]["applies"] = "applies"
            else:
                head = rev_parse(fork, "HEAD")
                write_stamp(fork, base_sha256=upstream.sha256, inputs=inputs_hash(new, upstream), head=head)
                print(f"  {new.rel(fork)}: {upstream.label} + overlay + {len(read_series(upstream))} patch(es)")
        stage(4, "Writing the pin file and re-exporting the patches")
        project.config_path.write_text(pin_text(config), encoding="utf-8")
        print(f"  wrote {new.rel(new.config_path)}: " + ", ".join(u.label for u in new.upstreams.values()))
        for upstream in new.upstreams.values():
            if not any(u is upstream for u, _ in conflicted):
                export_fork(new, upstream, force=False)
        stage(5, "Installing the forks and the stock sources")
        installed = True
        if conflicted:  # the venv and the stock sources stay on the releases the forks were built on
            print(
                f"  skipped while a PR conflicts: the venv and {project.rel(stock_dir(project))} stay on "
                + ", ".join(u.label for u in project.upstreams.values()),
                flush=True,
            )
        else:
            build_stock(new, stock_dir(new))
        if not args.no_install and not conflicted:
            try:  # pip checks the new releases' requirements: a failure is the stack's, the tests still run
                install_forks(new, list(new.upstreams.values()))
            except ForkError as err:
                print(f"  {err}: the venv cannot hold the new releases (see pip's output above)", flush=True)
                installed = False
        stage(6, "Running each PR's tests at its level, with its fix and without it")
        skip = {upstream.name for upstream, _ in conflicted}
        ready = (
            run_tests(new, prs, rows, Path(tmp) / "levels", args.pytest_args, skip) and not conflicted and installed
        )

    print_rows(prs, rows)
    for upstream, err in conflicted:
        print(
            f"\n{new.rel(upstream.fork_dir)} is left in the middle of `git am` at {err.patch}. To finish:\n"
            f"  cd {new.rel(upstream.fork_dir)}\n"
            "  # edit the files, then: git add <files> && git am --continue   (again for each later patch)\n"
            "  cd - && make patches && make check"
        )
    if conflicted:
        old = " and ".join(u.label for u in project.upstreams.values())
        print(
            f"\nOr go back to {old} (the venv and {project.rel(stock_dir(project))} are still on them):\n"
            f"  git checkout -- {' '.join(project.rel(p) for p in written)}\n"
            "  make fork FORK_ARGS=--force   # rebuilds the forks on the previous pins; the conflicted one is kept as "
            "a backup"
        )
    if not installed:
        print("\nThe forks could not be installed into the venv: pip could not meet the new releases' requirements.")
    print("\nThe stack is ready." if ready else "\nThe stack is NOT ready: see above.")
    return 0 if ready else 1


def written_paths(project: Project) -> list[Path]:
    """What an upgrade rewrites in the repository (it refuses to start while any of them has uncommitted changes)."""
    return [project.config_path, *(u.patches_dir for u in project.upstreams.values())]


def built_on(upstream, stamp: dict, head: str | None) -> bool:
    """Whether a fork's stamp says it was built on ``upstream``'s pinned release, up to its ``head``."""
    return stamp.get("base_sha256") == upstream.sha256 and stamp.get("head") == head


# The options of `fork.py upgrade` that UPGRADE_ARGS passes on: their argparse destinations.
UPGRADE_OPTIONS = {"--allow-older": "allow_older", "--force": "force", "--no-install": "no_install"}


def interrupted_upgrade(project: Project, args) -> str:
    """What an interrupted upgrade left, read from the repository and the forks, and how to go on (the same command
    again: its releases and options)."""
    again = "make upgrade" + "".join(
        f" {name.upper()}={getattr(args, name)}" for name in ("transformers", "accelerate") if getattr(args, name)
    )
    options = [option for option, on in UPGRADE_OPTIONS.items() if getattr(args, on)]
    again += f" UPGRADE_ARGS='{' '.join(options)}'" if options else ""
    changed = uncommitted_paths(project, written_paths(project))
    back = "make fork FORK_ARGS=--force"
    if changed:
        return (
            f"{', '.join(changed)} changed: finish with `make check` (it installs the forks and runs each PR's tests), "
            f"or go back with `git checkout -- {' '.join(project.rel(p) for p in written_paths(project))} && {back}`"
        )
    moved = [
        project.rel(u.fork_dir)
        for u in project.upstreams.values()
        if u.fork_dir.exists() and not built_on(u, read_stamp(u.fork_dir), rev_parse(u.fork_dir, "HEAD"))
    ]
    if moved:
        return (
            f"the pins and patches are unchanged; {', '.join(moved)} half-moved: `{back}` puts them back on the pins, "
            f"or run `{again}` again"
        )
    return f"nothing was changed; run `{again}` again"


def uncommitted_paths(project: Project, paths: list[Path]) -> list[str]:
    """Those of ``paths`` (files or folders of the repository) with changes git has not committed."""
    rels = [project.rel(p) for p in paths]
    proc = git(project.root, "status", "--porcelain", "--untracked-files=all", "--", *rels, check=False)
    if proc.returncode != 0:  # not a git repository: nothing to compare with
        return []
    return sorted({line[3:] for line in proc.stdout.decode().splitlines() if line.strip()})


def run_tests(project: Project, prs: list[PR], rows: dict, scratch: Path, pytest_args: str, skip: set) -> bool:
    """Fill in the rows' test columns (not for the upstreams in ``skip``, in conflict); whether every PR passes with its
    fix and fails without it."""
    scratch.mkdir()
    stock = stock_sources(project, scratch)
    ready = True
    for upstream in project.upstreams.values():
        if upstream.name in skip:
            continue
        try:
            build_levels(project, upstream, prs, scratch / upstream.name)
        except LevelConflict as err:
            rows[err.pr.name]["applies"] = f"does not apply at its level: {', '.join(err.conflict.files)}"
            ready = False
            continue
        results = pr_test_results(project, upstream, scratch / upstream.name, prs, scratch, pytest_args, stock)
        for pr in prs_of(prs, upstream):
            with_fix, without_fix = results[pr.name]
            rows[pr.name]["with"] = "pass" if with_fix is None else "FAIL"
            if without_fix is None:
                rows[pr.name]["without"] = "fail (as they must)"
            elif isinstance(without_fix, PassesWithoutFix):
                fork, files = upstream.fork_dir, patched_files(upstream, pr)
                changed = git(fork, "diff", "--name-only", PREVIOUS_BASE, BASE_REF, "--", *files).stdout.split()
                changed = [f.decode() for f in changed]
                rows[pr.name]["without"] = "PASS: possibly fixed upstream; changed under it: " + (
                    ", ".join(changed) or "none of its files"
                )
            else:
                rows[pr.name]["without"] = f"PROBLEM: {without_fix}"
            ready = ready and with_fix is None and without_fix is None
    return ready


def print_rows(prs: list[PR], rows: dict) -> None:
    width = max(len(pr.name) for pr in prs) if prs else 2
    print(f"\n{'PR'.ljust(width)}  {'applies'.ljust(12)}  {'with fix'.ljust(8)}  without fix")
    for pr in prs:
        row = rows[pr.name]
        print(f"{pr.name.ljust(width)}  {row['applies'].ljust(12)}  {row['with'].ljust(8)}  {row['without']}")
