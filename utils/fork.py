#!/usr/bin/env python3
"""Keep our transformers fork as an overlay plus a patch series on top of a pinned upstream sdist.

The repository holds only what we write:

* the *overlay*: new files of the PR, kept at their upstream paths (``src/transformers/**``, ``tests/trainer/**``,
  ``docs/source/en/**``), copied into the fork as they are;
* the *patch series*: edits to files that exist upstream, as ``git format-patch`` files under
  ``patches/transformers/`` listed in order by ``patches/transformers/.patches`` (one file name a line);
* the pin file ``patches/config.json``: the upstream sdist (version and sha256) and the pinned tool versions.

Subcommands (run ``python utils/fork.py <command> --help`` for options):

``build``   download (or reuse the cached) sdist, unpack it into ``build/transformers``, commit the pristine tree
            tagged ``upstream-base``, commit the overlay, ``git am`` the series, ``pip install -e`` the fork.
            With ``--clone PATH`` do the same on a new branch of an existing upstream git clone.
``export``  turn the fork's commits back into overlay files and patch files (byte-stable).
``check``   fail when the series does not apply to the pinned base, re-exporting would change files,
            ``.patches`` and the folder disagree, or a patch lacks a clean description.
``pr``      write a ``git am``-able series for the pristine sdist plus ``PR_DESCRIPTION.md`` to ``dist/``.
``deps``    install the pinned tools into the virtual environment (torch first), once per pin set.

Only the standard library is used, plus the ``git`` and ``pip`` command line tools.
"""

import argparse
import email.header
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


TOOL_VERSION = "1"
BASE_REF = "upstream-base"
# Marks the overlay commit `build` made, so that `export` knows which overlay files the fork changed
OVERLAY_REF = "workbench-overlay"
FORK_BRANCH = "main"
STAMP_NAME = "workbench-stamp.json"
DEPS_STAMP_NAME = ".workbench-deps.json"
IDENTITY_NAME = "Workbench"
IDENTITY_EMAIL = "workbench@example.invalid"
FIXED_DATE = "2000-01-01T00:00:00+0000"
ZERO_FROM = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
# Build artifacts that never belong to the overlay and never count as edits in the fork.
SKIP_DIR_NAMES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}
SKIP_FILE_SUFFIXES = (".pyc", ".pyo", ".swp", "~")
SKIP_FILE_NAMES = {".DS_Store"}
FORK_EXCLUDES = "*.egg-info/\n__pycache__/\n*.py[cod]\n.pytest_cache/\n.ruff_cache/\n.mypy_cache/\n"
UPSTREAM_URL = "https://github.com/huggingface/transformers"


class ForkError(Exception):
    """An error to report to the user as a plain message (no traceback)."""


class PatchConflict(ForkError):
    """``git am`` stopped on a patch; carries the patch name and the files that failed."""

    def __init__(self, patch: str, files: list[str], output: str, where: Path):
        self.patch = patch
        self.files = files
        self.output = output
        self.where = where
        names = ", ".join(files) if files else "(see git output above)"
        super().__init__(f"patch {patch} does not apply: {names}")


# --------------------------------------------------------------------------------------------------------------
# Project layout and configuration


@dataclass
class Project:
    """Paths and settings of the workbench, all derived from the repository root and the pin file."""

    root: Path
    config_path: Path
    config: dict
    fork_dir: Path
    venv: Path
    sdist_override: Path | None = None

    @property
    def upstream(self) -> dict:
        return self.config["upstream"]

    @property
    def package(self) -> str:
        return self.upstream["package"]

    @property
    def version(self) -> str:
        return self.upstream["version"]

    @property
    def sha256(self) -> str:
        return self.upstream["sha256"].lower()

    @property
    def sdist_name(self) -> str:
        return self.upstream.get("sdist", f"{self.package}-{self.version}.tar.gz")

    @property
    def cache_dir(self) -> Path:
        return self.root / "build" / "cache"

    @property
    def patches_dir(self) -> Path:
        return self.root / self.config.get("patches", "patches/transformers")

    @property
    def series_file(self) -> Path:
        return self.patches_dir / ".patches"

    @property
    def overlay_roots(self) -> list[str]:
        return [r.strip("/") for r in self.config.get("overlay", [])]

    @property
    def pins(self) -> dict:
        return self.config.get("pins", {})

    def rel(self, path: Path) -> str:
        """Path as shown to the user: relative to the repository root when inside it."""
        try:
            return str(path.resolve().relative_to(self.root))
        except ValueError:
            return str(path)


def load_project(args) -> Project:
    root = Path(args.repo_root).resolve() if args.repo_root else Path(__file__).resolve().parent.parent
    config_path = Path(args.config).resolve() if args.config else root / "patches" / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ForkError(f"pin file not found: {config_path}") from None
    except json.JSONDecodeError as e:
        raise ForkError(f"pin file {config_path} is not valid JSON: {e}") from None
    for key in ("package", "version", "sha256"):
        if key not in config.get("upstream", {}):
            raise ForkError(f"pin file {config_path} lacks upstream.{key}")
    fork_dir = Path(args.fork_dir).resolve() if getattr(args, "fork_dir", None) else root / "build" / "transformers"
    venv = Path(args.venv).resolve() if getattr(args, "venv", None) else root / ".venv"
    sdist = Path(args.sdist).resolve() if getattr(args, "sdist", None) else None
    return Project(
        root=root, config_path=config_path, config=config, fork_dir=fork_dir, venv=venv, sdist_override=sdist
    )


def is_skipped(rel_path: str) -> bool:
    """Whether a path is a build artifact that never belongs to the overlay."""
    parts = rel_path.split("/")
    if any(part in SKIP_DIR_NAMES or part.endswith(".egg-info") for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in SKIP_FILE_NAMES or name.endswith(SKIP_FILE_SUFFIXES)


def under_roots(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def read_overlay(project: Project) -> dict[str, tuple[bytes, bool]]:
    """The overlay files of the repository: ``{upstream path: (content, executable)}``, sorted by path."""
    files = {}
    for root in project.overlay_roots:
        base = project.root / root
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIR_NAMES)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                rel = path.relative_to(project.root).as_posix()
                if is_skipped(rel):
                    continue
                if path.is_symlink() or not path.is_file():
                    raise ForkError(f"overlay file {rel} is not a regular file (links are not supported)")
                files[rel] = (path.read_bytes(), os.access(path, os.X_OK))
    return dict(sorted(files.items()))


def read_series(project: Project) -> list[str]:
    """Patch file names from ``.patches``, in order (blank lines ignored)."""
    if not project.series_file.exists():
        return []
    lines = project.series_file.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def inputs_hash(project: Project) -> str:
    """Hash of everything a build depends on: the pin file, the series and the overlay."""
    h = hashlib.sha256()
    h.update(f"tool {TOOL_VERSION}\0".encode())
    h.update(project.config_path.read_bytes() + b"\0")
    series = read_series(project)
    h.update("\n".join(series).encode() + b"\0")
    for name in series:
        path = project.patches_dir / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>") + b"\0")
    for rel, (data, executable) in read_overlay(project).items():
        h.update(f"{rel}\0{int(executable)}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------------------
# git helpers


def git_env(fixed_identity: bool = True) -> dict:
    """Environment for git: no user or system config (reproducible output), fixed identity and dates."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C", LANG="C", GIT_TERMINAL_PROMPT="0")
    if fixed_identity:
        env.update(
            GIT_AUTHOR_NAME=IDENTITY_NAME,
            GIT_AUTHOR_EMAIL=IDENTITY_EMAIL,
            GIT_AUTHOR_DATE=FIXED_DATE,
            GIT_COMMITTER_NAME=IDENTITY_NAME,
            GIT_COMMITTER_EMAIL=IDENTITY_EMAIL,
            GIT_COMMITTER_DATE=FIXED_DATE,
        )
    return env


GIT_OPTIONS = ["-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "-c", "commit.gpgsign=false"]


def git(cwd: Path, *args: str, env: dict | None = None, check: bool = True, input: bytes | None = None):
    """Run git in ``cwd`` and return the completed process (bytes output)."""
    proc = subprocess.run(
        ["git", *GIT_OPTIONS, *args],
        cwd=cwd,
        env=env if env is not None else git_env(),
        input=input,
        capture_output=True,
    )
    if check and proc.returncode != 0:
        out = (proc.stdout + proc.stderr).decode(errors="replace").strip()
        raise ForkError(f"git {' '.join(args[:3])} failed in {cwd}:\n{out}")
    return proc


def git_text(cwd: Path, *args: str, env: dict | None = None) -> str:
    return git(cwd, *args, env=env).stdout.decode().strip()


def rev_parse(cwd: Path, ref: str) -> str | None:
    proc = git(cwd, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def git_dir(cwd: Path) -> Path:
    return Path(git_text(cwd, "rev-parse", "--absolute-git-dir"))


def am_in_progress(cwd: Path) -> bool:
    return (git_dir(cwd) / "rebase-apply").exists()


def dirty_paths(cwd: Path) -> list[str]:
    """Uncommitted changes (tracked and untracked), ignoring build artifacts such as ``*.egg-info``."""
    out = git(cwd, "status", "--porcelain", "-z", "--untracked-files=all").stdout.decode(errors="replace")
    paths, entries = [], out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if not entry:
            continue
        if entry[0] in "RC":  # a rename is followed by its source path
            i += 1
        path = entry[3:]
        if not is_skipped(path):
            paths.append(path)
    return paths


def ls_tree(cwd: Path, ref: str) -> dict[str, tuple[str, str]]:
    """``{path: (mode, blob sha)}`` of every file in ``ref``."""
    out = git(cwd, "ls-tree", "-r", "-z", "--full-tree", ref).stdout.decode()
    result = {}
    for entry in out.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            mode, _, sha = meta.split()
            result[path] = (mode, sha)
    return result


def read_blobs(cwd: Path, shas: list[str]) -> dict[str, bytes]:
    """Contents of many blobs with one ``git cat-file --batch``."""
    if not shas:
        return {}
    out = git(cwd, "cat-file", "--batch", input="".join(s + "\n" for s in shas).encode()).stdout
    blobs, pos = {}, 0
    for sha in shas:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        blobs[sha] = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
    return blobs


def commit_all(cwd: Path, message: str, env: dict | None = None, paths: list[str] | None = None) -> bool:
    """Stage ``paths`` (or everything) and commit; return False when there was nothing to commit."""
    if paths is None:
        git(cwd, "add", "-A", env=env)
    elif paths:
        literal = dict(env if env is not None else git_env(), GIT_LITERAL_PATHSPECS="1")
        pathspecs = "\0".join(paths).encode()
        git(cwd, "add", "-f", "--pathspec-from-file=-", "--pathspec-file-nul", input=pathspecs, env=literal)
    if git(cwd, "diff", "--cached", "--quiet", check=False, env=env).returncode == 0:
        return False
    git(cwd, "commit", "-q", "--no-verify", "-F", "-", input=message.encode(), env=env)
    return True


# --------------------------------------------------------------------------------------------------------------
# The upstream sdist


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_sdist(project: Project, path: Path, hint: str) -> None:
    got = sha256_file(path)
    if got != project.sha256:
        raise ForkError(
            f"sha256 mismatch for {project.rel(path)}:\n  expected {project.sha256} (from {project.rel(project.config_path)})"
            f"\n  got      {got}\n{hint}"
        )


def obtain_sdist(project: Project) -> Path:
    """The verified sdist: from ``--sdist``, else from the cache, else downloaded into the cache with pip."""
    cached = project.cache_dir / project.sdist_name
    if project.sdist_override is not None:
        if not project.sdist_override.is_file():
            raise ForkError(f"--sdist file not found: {project.sdist_override}")
        verify_sdist(project, project.sdist_override, "Pass the sdist of the pinned version, or fix the pin file.")
        if not cached.exists():
            project.cache_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(project.sdist_override, cached)
        return project.sdist_override
    delete_hint = f"Delete {project.rel(cached)} and run again to download it anew (or pass --sdist PATH)."
    if cached.exists():
        verify_sdist(project, cached, delete_hint)
        return cached
    download_sdist(project, cached)
    verify_sdist(project, cached, delete_hint)
    return cached


def download_sdist(project: Project, cached: Path) -> None:
    project.cache_dir.mkdir(parents=True, exist_ok=True)
    spec = f"{project.package}=={project.version}"
    print(f"Downloading the {spec} sdist from the package index ...", flush=True)
    with tempfile.TemporaryDirectory(dir=project.cache_dir, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or not found:
            raise ForkError(
                f"could not download the {spec} sdist (is the package index reachable?):\n"
                f"  {' '.join(cmd)}\n{(proc.stdout + proc.stderr).strip()}\n"
                f"Pass a local copy with --sdist PATH (it is checked against the sha256 in "
                f"{project.rel(project.config_path)}), or put it at {project.rel(cached)}."
            )
        shutil.move(found[0], cached)


def unpack_sdist(sdist: Path, dest: Path) -> None:
    """Unpack the sdist's single top-level folder as ``dest`` (no owners kept, unsafe members refused)."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.unpack-"))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tops = list(tmp.iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise ForkError(f"{sdist} does not hold exactly one top-level folder")
        tops[0].rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def create_pristine(project: Project, sdist: Path, dest: Path) -> None:
    """Unpack the sdist at ``dest``, ``git init`` it and commit it as tag ``upstream-base``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpack_sdist(sdist, dest)
    git(dest, "init", "-q", "-b", FORK_BRANCH)
    (git_dir(dest) / "info").mkdir(exist_ok=True)
    (git_dir(dest) / "info" / "exclude").write_text(FORK_EXCLUDES, encoding="utf-8")
    message = f"{project.package} {project.version} (pristine sdist)\n\nsha256: {project.sha256}\n"
    commit_all(dest, message)
    git(dest, "tag", BASE_REF)


# --------------------------------------------------------------------------------------------------------------
# Overlay and series


def add_overlay(project: Project, fork: Path, message: str, env: dict | None = None) -> None:
    """Copy the overlay into ``fork`` and commit it as one commit (refusing to overwrite upstream files)."""
    overlay = read_overlay(project)
    if not overlay:
        return
    existing = ls_tree(fork, "HEAD")
    clashes = [rel for rel in overlay if rel in existing]
    if clashes:
        raise ForkError(
            "overlay files exist upstream already (changes to upstream files must be patches): " + ", ".join(clashes)
        )
    for rel, (data, executable) in overlay.items():
        path = fork / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if executable else 0o644)
    commit_all(fork, message, env=env, paths=list(overlay))


def overlay_message(project: Project) -> str:
    pr = project.config.get("pr", {})
    subject = pr.get("overlay_subject", "Add the new files of this change")
    body = pr.get("overlay_body", "New modules, tests and docs; the edits to existing files follow as patches.")
    return f"{subject}\n\n{body}\n"


AM_FILE_PATTERNS = [
    re.compile(r"^error: patch failed: (.+):\d+$"),
    re.compile(
        r"^error: (.+?): (?:patch does not apply|does not exist in index|already exists in index|already exists in working directory|does not match index)$"
    ),
    re.compile(r"^CONFLICT \([^)]*\): Merge conflict in (.+)$"),
]


def apply_series(project: Project, fork: Path, three_way: bool, env: dict | None = None) -> None:
    """``git am`` the series onto ``fork``; on failure leave the ``git am`` state and raise PatchConflict."""
    series = read_series(project)
    missing = [name for name in series if not (project.patches_dir / name).is_file()]
    if missing:
        raise ForkError(f"{project.rel(project.series_file)} lists missing patch files: " + ", ".join(missing))
    if not series:
        return
    args = ["am", "-k", "--keep-cr", "--no-gpg-sign"] + (["-3"] if three_way else [])
    proc = git(fork, *args, *[str(project.patches_dir / name) for name in series], env=env, check=False)
    if proc.returncode == 0:
        return
    output = (proc.stdout + proc.stderr).decode(errors="replace")
    files = []
    for line in output.splitlines():
        for pattern in AM_FILE_PATTERNS:
            m = pattern.match(line.strip())
            if m and m.group(1) not in files:
                files.append(m.group(1))
    unmerged = git(fork, "diff", "--name-only", "--diff-filter=U", env=env, check=False).stdout.decode().split()
    files += [f for f in unmerged if f not in files]
    next_file = git_dir(fork) / "rebase-apply" / "next"
    index = int(next_file.read_text(encoding="utf-8")) if next_file.exists() else 0
    patch = series[index - 1] if 0 < index <= len(series) else "(unknown patch)"
    raise PatchConflict(patch, files, output.strip(), fork)


# --------------------------------------------------------------------------------------------------------------
# Export: fork commits -> overlay files + patch files


@dataclass
class ExportPlan:
    overlay: dict[str, tuple[bytes, bool]]
    patches: list[tuple[str, bytes]]
    # The overlay the fork was built with (at OVERLAY_REF), or None when HEAD does not descend from it
    built_overlay: dict[str, tuple[bytes, bool]] | None

    @property
    def series_text(self) -> bytes:
        return "".join(name + "\n" for name, _ in self.patches).encode()


def patch_subject(patch: bytes) -> str:
    """The decoded ``Subject:`` header of a format-patch file."""
    headers = patch.split(b"\n\n", 1)[0].decode("utf-8", errors="replace")
    m = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", headers, re.MULTILINE)
    if not m:
        return ""
    raw = re.sub(r"\n[ \t]+", " ", m.group(1))
    return str(email.header.make_header(email.header.decode_header(raw)))


def patch_file_name(subject: str, taken: set[str]) -> str:
    """File name for a patch: its subject in lower snake case (Electron style), unique within the series."""
    stem = re.sub(r"[^a-z0-9]+", "_", subject.lower()).strip("_")[:72].rstrip("_") or "patch"
    name, n = f"{stem}.patch", 2
    while name in taken:
        name, n = f"{stem}_{n}.patch", n + 1
    taken.add(name)
    return name


def plan_export(project: Project, fork: Path) -> ExportPlan:
    """What the repository's overlay and patches should be for the fork's HEAD."""
    if rev_parse(fork, BASE_REF) is None:
        raise ForkError(f"{fork} has no '{BASE_REF}' tag marking the pristine upstream tree")
    if git(fork, "merge-base", "--is-ancestor", BASE_REF, "HEAD", check=False).returncode != 0:
        raise ForkError(f"HEAD of {fork} does not descend from '{BASE_REF}'")
    if git_text(fork, "rev-list", "--merges", f"{BASE_REF}..HEAD"):
        raise ForkError(f"{fork} has merge commits after '{BASE_REF}'; rebase to a linear history first")
    roots = project.overlay_roots
    base = ls_tree(fork, BASE_REF)

    def overlay_at(ref):
        new = {rel: entry for rel, entry in ls_tree(fork, ref).items() if rel not in base and under_roots(rel, roots)}
        for rel, (mode, _) in new.items():
            if mode not in ("100644", "100755"):
                raise ForkError(f"overlay file {rel} in {fork} is not a regular file (mode {mode})")
        blobs = read_blobs(fork, sorted({sha for _, sha in new.values()}))
        return {rel: (blobs[sha], mode == "100755") for rel, (mode, sha) in sorted(new.items())}

    built = rev_parse(fork, OVERLAY_REF)
    built_on_head = built and git(fork, "merge-base", "--is-ancestor", built, "HEAD", check=False).returncode == 0
    built_overlay = overlay_at(built) if built_on_head else None

    touched = set()
    for commit in git_text(fork, "rev-list", "--reverse", f"{BASE_REF}..HEAD").split():
        out = git(fork, "diff-tree", "--no-commit-id", "--name-only", "-r", "-z", "--no-renames", commit).stdout
        touched.update(p for p in out.decode().split("\0") if p)
    # Build artifacts (``*.egg-info`` that ``pip install -e`` rewrites) never become patches.
    pathspecs = sorted(p for p in touched if (p in base or not under_roots(p, roots)) and not is_skipped(p))
    patches = []
    if pathspecs:
        env = git_env()
        env["GIT_LITERAL_PATHSPECS"] = "1"
        stream = git(
            fork,
            "format-patch",
            "--keep-subject",
            "--no-stat",
            "--no-signature",
            "--zero-commit",
            "--full-index",
            "--stdout",
            "--no-renames",
            "--no-notes",
            "--no-thread",
            "--diff-algorithm=myers",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            f"{BASE_REF}..HEAD",
            "--",
            *pathspecs,
            env=env,
        ).stdout
        taken: set[str] = set()
        for chunk in split_patches(stream):
            patches.append((patch_file_name(patch_subject(chunk), taken), chunk))
    return ExportPlan(overlay=overlay_at("HEAD"), patches=patches, built_overlay=built_overlay)


def split_patches(stream: bytes) -> list[bytes]:
    starts = [
        m.start() for m in re.finditer(re.escape(ZERO_FROM), stream) if m.start() == 0 or stream[m.start() - 1] == 10
    ]
    return [stream[a:b] for a, b in zip(starts, starts[1:] + [len(stream)])]


def plan_changes(project: Project, plan: ExportPlan) -> list[tuple[str, Path, bytes | None, bool]]:
    """
    Differences between the plan and the repository: ``(action, path, content, executable)`` tuples.

    An overlay file is a three-way decision against the overlay the fork was built with: a file the fork left alone
    keeps the repository's version (even if the repository changed it since), a file only the fork changed is
    written or deleted, and a file both changed differently is a ``"conflict"``. When the fork's history no longer
    holds the overlay it was built with, the fork's version wins.
    """
    changes = []
    current = read_overlay(project)
    for rel in sorted(set(plan.overlay) | set(current)):
        ours, theirs = current.get(rel), plan.overlay.get(rel)
        built = plan.built_overlay.get(rel) if plan.built_overlay is not None else ours
        if theirs == ours or theirs == built:
            continue
        action = "conflict" if ours != built else "write" if theirs is not None else "delete"
        data, executable = theirs if theirs is not None else (None, False)
        changes.append((action, project.root / rel, data, executable))
    wanted = dict(plan.patches)
    for name, data in plan.patches:
        path = project.patches_dir / name
        if not path.is_file() or path.read_bytes() != data:
            changes.append(("write", path, data, False))
    if project.patches_dir.is_dir():
        for path in sorted(project.patches_dir.glob("*.patch")):
            if path.name not in wanted:
                changes.append(("delete", path, None, False))
    series = plan.series_text
    if not project.series_file.is_file() or project.series_file.read_bytes() != series:
        changes.append(("write", project.series_file, series, False))
    return changes


def apply_changes(project: Project, changes) -> None:
    for action, path, data, executable in changes:
        if action == "write":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o755 if executable else 0o644)
        else:
            path.unlink()
            parent = path.parent
            while parent != project.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent


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


def installed_editable_from(project: Project, fork: Path) -> bool:
    """Whether the venv has ``package`` installed in editable mode from ``fork``."""
    code = (
        "import importlib.metadata as m, sys\n"
        "try:\n    print(m.distribution(sys.argv[1]).read_text('direct_url.json') or '')\n"
        "except m.PackageNotFoundError:\n    pass\n"
    )
    proc = subprocess.run([venv_python(project), "-c", code, project.package], capture_output=True, text=True)
    try:
        info = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        return False
    return info.get("dir_info", {}).get("editable", False) and info.get("url") == fork.resolve().as_uri()


def pip_install(project: Project, *args: str) -> None:
    cmd = [str(venv_python(project)), "-m", "pip", "install", *args]
    print("+ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise ForkError(f"pip install failed: {' '.join(cmd)}")


def install_fork(project: Project, fork: Path) -> None:
    if not venv_python(project).exists():
        raise ForkError(
            f"no virtual environment at {project.rel(project.venv)}: run `make fork`, or pass --no-install"
        )
    if installed_editable_from(project, fork):
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in project.pins.items()))
        constraints.flush()
        pip_install(project, "-c", constraints.name, "-e", str(fork))


# --------------------------------------------------------------------------------------------------------------
# Commands


def conflict_help(project: Project, err: PatchConflict) -> str:
    return (
        f"{err.output}\n\n"
        f"Patch {project.rel(project.patches_dir / err.patch)} did not apply"
        + (f" to: {', '.join(err.files)}" if err.files else "")
        + f".\nThe fork is left in the middle of `git am` in {err.where}. To resolve:\n"
        f"  cd {err.where}\n"
        "  # fix the files, then: git add <files> && git am --continue   (or git am --skip / git am --abort)\n"
        f"  python {project.rel(Path(__file__))} export   # writes the resolved series back into the repository\n"
        "Pass -3 to `build` to let git try a three-way merge."
    )


def unexported_changes(project: Project, fork: Path) -> list[str]:
    """Repository files that an export of ``fork`` would change (empty: everything in the fork is exported)."""
    return [
        f"{action} {project.rel(path)}" for action, path, _, _ in plan_changes(project, plan_export(project, fork))
    ]


def fork_losses(project: Project, fork: Path, stamp: dict) -> list[str]:
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
            changes = unexported_changes(project, fork)
            if changes:
                shown = "\n    ".join(changes[:10]) + ("\n    ..." if len(changes) > 10 else "")
                reasons.append(f"{fork} has commits that are not exported; export would:\n    {shown}")
    return reasons


def backup_path(fork: Path) -> Path:
    n = 1
    while (fork.parent / f"{fork.name}.backup-{n}").exists():
        n += 1
    return fork.parent / f"{fork.name}.backup-{n}"


def cmd_build(project: Project, args) -> int:
    if args.clone:
        return build_clone(project, args)
    fork = project.fork_dir
    inputs = inputs_hash(project)
    stamp = {}
    if fork.exists():
        is_repo = (fork / ".git").exists()
        stamp = read_stamp(fork) if is_repo else {}
        head = rev_parse(fork, "HEAD") if is_repo else None
        if is_repo and stamp.get("inputs") == inputs and stamp.get("head") == head and not am_in_progress(fork):
            print(f"{project.rel(fork)} is up to date (nothing to do)")
            if not args.no_install:
                install_fork(project, fork)
            return 0
        losses = fork_losses(project, fork, stamp)
        if losses and not args.force:
            raise ForkError(
                "refusing to rebuild, that would lose work:\n  "
                + "\n  ".join(losses)
                + f"\nRun `python {project.rel(Path(__file__))} export` (make patches) first, or pass --force "
                "(the old fork is then kept as a backup folder next to it)."
            )
        reuse = not losses and stamp.get("base_sha256") == project.sha256 and rev_parse(fork, BASE_REF) is not None
    else:
        losses, reuse = [], False

    if reuse:
        print(f"Resetting {project.rel(fork)} to '{BASE_REF}' ...", flush=True)
        clear_stamp(fork)
        git(fork, "checkout", "-q", "-f", "-B", FORK_BRANCH, BASE_REF)
        git(fork, "clean", "-q", "-f", "-d")
    else:
        sdist = obtain_sdist(project)
        fork.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=fork.parent, prefix=f".{fork.name}.new-")) / fork.name
        try:
            print(f"Unpacking {project.rel(sdist)} ...", flush=True)
            create_pristine(project, sdist, staging)
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
    add_overlay(project, fork, overlay_message(project))
    git(fork, "tag", "-f", OVERLAY_REF)
    try:
        apply_series(project, fork, args.three_way)
    except PatchConflict as err:
        raise ForkError(conflict_help(project, err)) from None
    write_stamp(fork, base_sha256=project.sha256, inputs=inputs, head=rev_parse(fork, "HEAD"))
    count = len(read_series(project))
    print(f"Built {project.rel(fork)}: {project.package} {project.version} + overlay + {count} patch(es)")
    if not args.no_install:
        install_fork(project, fork)
    return 0


def build_clone(project: Project, args) -> int:
    """Overlay and series on a new branch of an existing upstream clone (how the real PR is opened)."""
    clone = Path(args.clone).resolve()
    if not (clone / ".git").exists():
        raise ForkError(f"{clone} is not a git clone")
    # The contributor's own identity, when git has one; the fixed one otherwise.
    user_env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    has_identity = subprocess.run(["git", "config", "user.email"], cwd=clone, capture_output=True).returncode == 0
    env = user_env if has_identity else git_env()
    if am_in_progress(clone):
        raise ForkError(f"a `git am` is in progress in {clone}; finish or abort it first")
    dirty = dirty_paths(clone)
    if dirty:
        raise ForkError(f"{clone} has uncommitted changes ({', '.join(dirty[:10])}); commit or stash them first")
    branch = args.branch or project.config.get("pr", {}).get("branch", "workbench-pr")
    if rev_parse(clone, f"refs/heads/{branch}") is not None and not args.force:
        raise ForkError(f"branch {branch} exists in {clone}; pass --branch NAME or --force to reset it")
    git(clone, "checkout", "-q", "-B", branch, env=env)
    add_overlay(project, clone, overlay_message(project), env=env)
    try:
        apply_series(project, clone, args.three_way, env=env)
    except PatchConflict as err:
        raise ForkError(conflict_help(project, err)) from None
    print(f"Branch {branch} of {clone} now holds the overlay and {len(read_series(project))} patch(es).")
    print("Run the tests there, push the branch and open the PR with dist/PR_DESCRIPTION.md (make pr).")
    return 0


def cmd_export(project: Project, args) -> int:
    fork = project.fork_dir
    if not (fork / ".git").exists():
        raise ForkError(f"no fork at {fork}: run `make fork` first")
    if am_in_progress(fork):
        raise ForkError(f"a `git am` is in progress in {fork}; finish it (git am --continue) before exporting")
    dirty = dirty_paths(fork)
    if dirty:
        raise ForkError(
            f"{fork} has uncommitted changes ({', '.join(dirty[:10])}): commit them inside the fork, then export"
        )
    plan = plan_export(project, fork)
    changes = plan_changes(project, plan)
    conflicts = [project.rel(path) for action, path, _, _ in changes if action == "conflict"]
    if conflicts and not args.force:
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
    if at_risk and not args.force:
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
        print("Nothing to export: the repository matches the fork")
    exported = {project.rel(project.root / rel): sha256_bytes(data) for rel, (data, _) in plan.overlay.items()}
    exported.update({project.rel(project.patches_dir / n): sha256_bytes(data) for n, data in plan.patches})
    exported[project.rel(project.series_file)] = sha256_bytes(plan.series_text)
    write_stamp(
        fork,
        base_sha256=stamp.get("base_sha256"),
        inputs=inputs_hash(project),
        head=rev_parse(fork, "HEAD"),
        exported=exported,
    )
    return 0


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def patch_description(patch: bytes) -> list[str]:
    """Subject and body lines of a format-patch file (the message above the diff)."""
    text = patch.decode("utf-8", errors="replace")
    head, _, rest = text.partition("\n\n")
    subject = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", head, re.MULTILINE)
    lines = subject.group(1).split("\n") if subject else []
    body = []
    for line in rest.split("\n"):
        if line == "---" or line.startswith("diff --git "):
            break
        body.append(line)
    return lines + [""] + body


def lint_series(project: Project) -> list[str]:
    """Problems with the order file and the patch messages."""
    problems = []
    rel_series = project.rel(project.series_file)
    if not project.series_file.is_file():
        problems.append(f"{rel_series} is missing (an empty file means no patches)")
    series = read_series(project)
    seen = set()
    for name in series:
        if name in seen:
            problems.append(f"{rel_series} lists {name} twice")
        seen.add(name)
        if not (project.patches_dir / name).is_file():
            problems.append(f"{rel_series} lists {name}, but {project.rel(project.patches_dir / name)} does not exist")
    if project.patches_dir.is_dir():
        for path in sorted(project.patches_dir.iterdir()):
            if path.name != ".patches" and path.name not in seen:
                problems.append(f"{project.rel(path)} is not listed in {rel_series}")
    for name in series:
        path = project.patches_dir / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if not data.startswith(b"From "):
            problems.append(f"{project.rel(path)} is not a git format-patch file")
            continue
        lines = patch_description(data)
        body = lines[lines.index("") + 1 :]
        if not "".join(body).strip():
            problems.append(
                f"{project.rel(path)} has no description: say why the change is needed and that it is meant for upstream"
            )
        spaced = [line for line in lines if line != line.rstrip()]
        if spaced:
            problems.append(f"{project.rel(path)} has trailing whitespace in its description: {spaced[0]!r}")
    return problems


def build_temporary_fork(project: Project, tmp: Path, message: str | None = None, env: dict | None = None) -> Path:
    """Pristine sdist + overlay + series in ``tmp`` (raises PatchConflict when the series does not apply)."""
    fork = tmp / "fork"
    create_pristine(project, obtain_sdist(project), fork)
    add_overlay(project, fork, message or overlay_message(project), env=env)
    apply_series(project, fork, three_way=False, env=env)
    return fork


def cmd_check(project: Project, args) -> int:
    problems = lint_series(project)
    if all((project.patches_dir / name).is_file() for name in read_series(project)):
        with tempfile.TemporaryDirectory(prefix="fork-check-") as tmp:
            try:
                fork = build_temporary_fork(project, Path(tmp))
            except PatchConflict as err:
                where = f": {', '.join(err.files)}" if err.files else ""
                problems.append(
                    f"{project.rel(project.patches_dir / err.patch)} does not apply cleanly to "
                    f"{project.package} {project.version}{where}\n  git said:\n    "
                    + "\n    ".join(err.output.splitlines()[-8:])
                    + "\n  Fix it with `build -3` in the fork, `git am --continue`, then `export`."
                )
            else:
                for change in unexported_changes(project, fork):
                    problems.append(f"re-exporting would {change} (run `make fork`, then `make patches`)")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"OK: {len(read_series(project))} patch(es) apply cleanly to {project.package} {project.version} and are exported"
    )
    return 0


PR_SECTIONS = [
    "What does this PR do?",
    "Before / after",
    "How was this tested?",
    "Before submitting",
    "Who can review?",
]


def read_pr_body(project: Project) -> dict[str, str]:
    """Sections of the optional ``docs/pr_body.md`` (``## Title`` headings), keyed by lower-case title."""
    path = project.root / project.config.get("pr", {}).get("body", "docs/pr_body.md")
    if not path.is_file():
        return {}
    sections, title = {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            title = line[3:].strip().lower()
            sections[title] = ""
        elif title is not None:
            sections[title] += line + "\n"
    return {k: v.strip() for k, v in sections.items()}


def pr_description(project: Project, overlay: list[str], patched: list[str]) -> str:
    pr = project.config.get("pr", {})
    given = read_pr_body(project)

    def section(title: str, default: str) -> str:
        return f"## {title}\n\n{given.get(title.lower(), default)}\n"

    fixes = pr.get("fixes", "")
    tests = [f for f in overlay if f.startswith("tests/") and Path(f).name.startswith("test_")]
    test_cmd = "\n".join(f"python -m pytest {t}" for t in tests) or "python -m pytest tests/trainer"
    files = "\n".join([f"- `{f}` (new)" for f in overlay] + [f"- `{f}`" for f in patched]) or "- (none)"
    parts = [
        section(
            "What does this PR do?",
            "<!-- FILL: what the change does and why (motivation, design, backward compatibility). -->"
            + (f"\n\nFixes {fixes}" if fixes else ""),
        ),
        section(
            "Before / after",
            "<!-- FILL: evidence — the same fp16 run resumed from a checkpoint before and after this change "
            "(losses, grad-scaler scale, plot). -->",
        ),
        section(
            "How was this tested?",
            f"```bash\n{test_cmd}\n```\n\n<!-- FILL: hardware (CPU / GPU model), torch and accelerate versions, results. -->",
        ),
        f"Files changed:\n\n{files}\n",
        section(
            "Before submitting",
            "- [ ] This PR fixes a typo or improves the docs (you can dismiss the other checks if that's the case).\n"
            "- [ ] Did you read the [contributor guideline](https://github.com/huggingface/transformers/blob/main/"
            "CONTRIBUTING.md#create-a-pull-request), Pull Request section?\n"
            f"- [ ] Was this discussed/approved via a GitHub issue or the forum? {fixes}\n"
            "- [ ] Did you make sure to update the documentation with your changes?\n"
            "- [ ] Did you write any new necessary tests?",
        ),
        section(
            "Who can review?",
            pr.get(
                "reviewers",
                "Trainer maintainers: <!-- FILL: @-mention the trainer maintainers listed in upstream's "
                "PR template -->",
            ),
        ),
    ]
    extra = [f"## {t.title()}\n\n{v}\n" for t, v in given.items() if t not in {s.lower() for s in PR_SECTIONS}]
    return "\n".join(parts[:3] + extra + parts[3:])


def cmd_pr(project: Project, args) -> int:
    out = Path(args.out).resolve() if args.out else project.root / "dist"
    if args.author:
        m = re.fullmatch(r"\s*(.+?)\s*<([^>]+)>\s*", args.author)
        if not m:
            raise ForkError("--author must look like 'Name <email>'")
        env = git_env()
        env.update(GIT_AUTHOR_NAME=m.group(1), GIT_AUTHOR_EMAIL=m.group(2))
    else:
        env = git_env()
    with tempfile.TemporaryDirectory(prefix="fork-pr-") as tmp:
        try:
            fork = build_temporary_fork(project, Path(tmp), env=env)
        except PatchConflict as err:
            raise ForkError(f"cannot write the PR: {err} (run `make check` for details)") from None
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("[0-9][0-9][0-9][0-9]-*.patch"):
            old.unlink()
        git(
            fork,
            "format-patch",
            "--zero-commit",
            "--full-index",
            "--no-signature",
            "--no-renames",
            "-o",
            str(out),
            f"{BASE_REF}..HEAD",
        )
        base = ls_tree(fork, BASE_REF)
        changed = git_text(fork, "diff", "--name-only", "--no-renames", BASE_REF, "HEAD").splitlines()
    overlay = [f for f in changed if f not in base]
    patched = [f for f in changed if f in base]
    (out / "PR_DESCRIPTION.md").write_text(pr_description(project, overlay, patched), encoding="utf-8")
    for path in sorted(out.iterdir()):
        print(f"wrote {project.rel(path)}")
    print(
        f"Apply onto a pristine {project.package} {project.version} sdist that is `git init`ed and committed with:\n"
        f"  git am {project.rel(out)}/*.patch"
    )
    return 0


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
    common.add_argument("--repo-root", help="root of the workbench repository (default: the one holding this script)")
    common.add_argument("--config", help="pin file (default: REPO/patches/config.json)")
    common.add_argument("--fork-dir", help="the fork (default: REPO/build/transformers)")
    common.add_argument("--sdist", help="use this local sdist instead of the cache or the package index (sha-checked)")
    common.add_argument("--venv", help="virtual environment (default: REPO/.venv)")

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", parents=[common], help="build the fork (a fast no-op when nothing changed)")
    build.add_argument("--clone", help="apply the overlay and series on a new branch of this upstream git clone")
    build.add_argument("--branch", help="branch to create with --clone (default: pr.branch from the pin file)")
    build.add_argument("-3", "--3way", dest="three_way", action="store_true", help="let git am do three-way merges")
    build.add_argument(
        "--force", action="store_true", help="rebuild even when the fork has unexported work (kept as a backup)"
    )
    build.add_argument("--no-install", action="store_true", help="skip the editable pip install into the venv")
    export = sub.add_parser("export", parents=[common], help="write the fork's commits back as overlay and patches")
    export.add_argument("--force", action="store_true", help="overwrite repository files with uncommitted changes")
    sub.add_parser("check", parents=[common], help="verify the series applies and is exported, lint the patches")
    pr = sub.add_parser("pr", parents=[common], help="write the PR series and description to dist/")
    pr.add_argument("--out", help="output folder (default: REPO/dist)")
    pr.add_argument("--author", help="author of the overlay commit, 'Name <email>' (default: the fixed identity)")
    sub.add_parser("deps", parents=[common], help="install the pinned tools into the venv (torch first)")
    return parser.parse_args(argv)


COMMANDS = {"build": cmd_build, "export": cmd_export, "check": cmd_check, "pr": cmd_pr, "deps": cmd_deps}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return COMMANDS[args.command](load_project(args), args)
    except ForkError as err:
        print(f"fork.py {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
