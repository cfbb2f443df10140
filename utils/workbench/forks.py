"""The forks: ``build`` (pristine sdist + overlay commit + series, editable install), ``build --clone`` (the stack on a
contributor's clone) and ``export`` (the forks' commits back into overlay and patch files)."""

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .gitutil import (
    ForkError,
    PatchConflict,
    am_in_progress,
    git,
    git_dir,
    git_env,
    rev_parse,
    status_paths,
)
from .opener import build_clone
from .overlay import add_overlay, is_skipped, read_overlay
from .project import Project, Upstream
from .series import (
    OVERLAY_REF,
    apply_changes,
    apply_patches,
    plan_changes,
    plan_export,
    read_series,
    unexported_changes,
)
from .sources import BASE_REF, FORK_BRANCH, build_stock, create_pristine, obtain_sdist, stock_dir
from .stack import load_stack, stack_problems


TOOL_VERSION = "2"
STAMP_NAME = "workbench-stamp.json"
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


def installed_from_fork(project: Project, upstream: Upstream) -> bool:
    """Whether the venv has the package installed in editable mode from its fork, at the pinned version (a new
    release needs a new install, so that pip checks its requirements)."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "try:\n    d = m.distribution(sys.argv[1])\n"
        "    print(json.dumps([json.loads(d.read_text('direct_url.json') or '{}'), d.version]))\n"
        "except m.PackageNotFoundError:\n    print('[{}, null]')\n"
    )
    proc = subprocess.run([venv_python(project), "-c", code, upstream.package], capture_output=True, text=True)
    try:
        info, version = json.loads(proc.stdout)
    except ValueError:
        return False
    editable = info.get("dir_info", {}).get("editable", False)
    return editable and info.get("url") == upstream.fork_dir.resolve().as_uri() and version == upstream.version


def pip_install(project: Project, *args: str) -> None:
    cmd = [str(venv_python(project)), "-m", "pip", "install", *args]
    print("+ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise ForkError(f"pip install failed: {' '.join(cmd)}")


def install_forks(project: Project, upstreams: list[Upstream]) -> None:
    """``pip install -e`` the forks that are not installed editable from their folder, at their pinned version, yet
    (one pip run)."""
    if not venv_python(project).exists():
        raise ForkError(
            f"no virtual environment at {project.rel(project.venv)}: run `make fork`, or pass --no-install"
        )
    todo = [u for u in upstreams if not installed_from_fork(project, u)]
    if not todo:
        return
    packages = {u.package for u in project.upstreams.values()}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as constraints:
        pins = {name: version for name, version in project.pins.items() if name not in packages}
        constraints.write("".join(f"{name}=={version}\n" for name, version in pins.items()))
        constraints.flush()
        pip_install(project, "-c", constraints.name, *[arg for u in todo for arg in ("-e", str(u.fork_dir))])


# A venv's python prints which of the requirements (JSON, argv[1]) it does not satisfy.
UNMET_CODE = """import importlib.metadata as m, json, sys
from packaging.requirements import Requirement
unmet = []
for text in json.loads(sys.argv[1]):
    r = Requirement(text)
    if r.marker is not None and not r.marker.evaluate():
        continue
    try:
        ok = r.specifier.contains(m.version(r.name), prereleases=True)
    except m.PackageNotFoundError:
        ok = False
    if not ok:
        unmet.append(text)
print(json.dumps(unmet))
"""


def index_has(project: Project, requirement: str) -> bool:
    """Whether the package index has a release that satisfies ``requirement`` (``pip download --no-deps``)."""
    with tempfile.TemporaryDirectory(prefix="index-") as dest:
        cmd = [str(venv_python(project)), "-m", "pip", "download", "--quiet", "--no-deps", "--dest", dest, requirement]
        return subprocess.run(cmd, capture_output=True).returncode == 0


def requirement_problems(project: Project) -> list[str]:
    """The requirements of the pinned releases (their ``PKG-INFO``) that the venv does not satisfy, each with what the
    package index says: has it (``make fork`` installs it) or lacks it (the release cannot be installed here)."""
    packages = {u.package for u in project.upstreams.values()}
    requirements = [
        (u, r)
        for u in project.upstreams.values()
        if (u.fork_dir / "PKG-INFO").is_file()
        for r in requirements_of(u.fork_dir)
        if requirement_name(r) not in packages
    ]
    if not requirements:
        return []
    proc = subprocess.run(
        [str(venv_python(project)), "-c", UNMET_CODE, json.dumps([r for _, r in requirements])],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return [
            f"could not check the requirements of the pinned releases in {project.rel(project.venv)}: {proc.stderr}"
        ]
    unmet = json.loads(proc.stdout)
    return [
        f"{u.label} requires {r}, which {project.rel(project.venv)} does not have: "
        + (
            "the package index has it (`make fork` installs it)"
            if index_has(project, r)
            else "the package index has no release that satisfies it (pip download --no-deps found none)"
        )
        for u, r in requirements
        if r in unmet
    ]


def requirement_name(requirement: str) -> str:
    """The normalized project name a requirement names (``kernels<0.20,>=0.19.1`` -> ``kernels``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def requirements_of(tree: Path) -> list[str]:
    """The unconditional ``Requires-Dist`` of an unpacked sdist's ``PKG-INFO`` (extras left out)."""
    text = (tree / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
    found = re.findall(r"^Requires-Dist: (.+)$", text, flags=re.MULTILINE)
    return [r.strip() for r in found if "extra ==" not in r]


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
        unchanged = is_repo and stamp.get("inputs") == inputs and stamp.get("head") == head
        if unchanged and not am_in_progress(fork) and not args.force:
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
        return build_clone(project, args)  # the branches of a contributor's clone: opener.py
    for upstream in upstreams:
        build_fork(project, upstream, args)
    build_stock(project, stock_dir(project))
    if not args.no_install:
        install_forks(project, upstreams)
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
    stamp = read_stamp(fork)
    exported = frozenset(  # overlay files the repository still holds as the last export wrote them
        rel
        for rel, (data, _) in read_overlay(upstream).items()
        if stamp.get("exported", {}).get(project.rel(upstream.repo_dir / rel)) == sha256_bytes(data)
    )
    changes = plan_changes(upstream, plan, exported)
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
        if any("belongs to no PR" in note for note in notes):
            print(
                "note: a change meant for an existing PR goes into that PR's commit, not a new one: "
                'git commit --fixup=":/<its subject>", then git -c sequence.editor=: rebase -i --autosquash '
                f"{OVERLAY_REF} (README: Working on the patches)"
            )
    return 0
