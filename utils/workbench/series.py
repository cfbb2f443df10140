"""The patch series: edits to existing upstream files as ``git format-patch`` files, applied with ``git am``, and
exported back byte-stably from a fork's commits (together with the overlay)."""

import email.header
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .gitutil import ForkError, PatchConflict, git, git_dir, git_env, git_text, ls_tree, read_blobs, rev_parse
from .overlay import Files, is_skipped, read_overlay, repo_path, under_roots
from .project import Project, Upstream
from .sources import BASE_REF


# Marks the overlay commit `build` made, so that `export` knows which overlay files the fork changed
OVERLAY_REF = "workbench-overlay"
ZERO_FROM = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"


def read_series(upstream: Upstream) -> list[str]:
    """Patch file names from ``.patches``, in order (blank lines ignored)."""
    if not upstream.series_file.exists():
        return []
    lines = upstream.series_file.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


AM_FILE_PATTERNS = [
    re.compile(r"^error: patch failed: (.+):\d+$"),
    re.compile(
        r"^error: (.+?): (?:patch does not apply|does not exist in index|already exists in index|already exists in working directory|does not match index)$"
    ),
    re.compile(r"^CONFLICT \([^)]*\): Merge conflict in (.+)$"),
    re.compile(r"^error: invalid object \d+ [0-9a-f]+ for '(.+)'$"),  # -3 without the blob the patch was made on
]


def failed_files(fork: Path, output: str, env: dict | None) -> list[str]:
    files = []
    for line in output.splitlines():
        for pattern in AM_FILE_PATTERNS:
            m = pattern.match(line.strip())
            if m and m.group(1) not in files:
                files.append(m.group(1))
    unmerged = git(fork, "diff", "--name-only", "--diff-filter=U", env=env, check=False).stdout.decode().split()
    return files + [f for f in unmerged if f not in files]


def apply_patches(
    upstream: Upstream,
    fork: Path,
    names: list[str],
    three_way: bool = False,
    env: dict | None = None,
    reset_author: bool = False,
) -> None:
    """``git am`` the patches ``names`` (files of ``upstream.patches_dir``) onto ``fork``; on failure leave the
    ``git am`` state and raise PatchConflict. ``reset_author`` makes ``env``'s identity the author of each commit."""
    missing = [name for name in names if not (upstream.patches_dir / name).is_file()]
    if missing:
        raise ForkError(f"missing patch files in {upstream.patches_dir}: " + ", ".join(missing))
    if not names:
        return
    args = ["am", "-k", "--keep-cr", "--no-gpg-sign"] + (["-3"] if three_way else [])
    batches = [[name] for name in names] if reset_author else [names]
    for batch in batches:
        proc = git(fork, *args, *[str(upstream.patches_dir / name) for name in batch], env=env, check=False)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).decode(errors="replace")
            next_file = git_dir(fork) / "rebase-apply" / "next"
            index = int(next_file.read_text(encoding="utf-8")) if next_file.exists() else 0
            patch = batch[index - 1] if 0 < index <= len(batch) else batch[0]
            raise PatchConflict(patch, failed_files(fork, output, env), output.strip(), fork)
        if reset_author:
            git(fork, "commit", "-q", "--amend", "--no-edit", "--no-verify", "--reset-author", env=env)


# --------------------------------------------------------------------------------------------------------------
# Lint


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


def lint_series(project: Project, upstream: Upstream) -> list[str]:
    """Problems with the order file and the patch messages."""
    problems = []
    rel_series = project.rel(upstream.series_file)
    if not upstream.series_file.is_file():
        problems.append(f"{rel_series} is missing (an empty file means no patches)")
    series = read_series(upstream)
    seen = set()
    for name in series:
        if name in seen:
            problems.append(f"{rel_series} lists {name} twice")
        seen.add(name)
        if not (upstream.patches_dir / name).is_file():
            problems.append(
                f"{rel_series} lists {name}, but {project.rel(upstream.patches_dir / name)} does not exist"
            )
    if upstream.patches_dir.is_dir():
        for path in sorted(upstream.patches_dir.iterdir()):
            if path.name != ".patches" and path.name not in seen:
                problems.append(f"{project.rel(path)} is not listed in {rel_series}")
    for name in series:
        path = upstream.patches_dir / name
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


# --------------------------------------------------------------------------------------------------------------
# Export: fork commits -> overlay files + patch files


@dataclass
class ExportPlan:
    overlay: Files
    patches: list[tuple[str, bytes]]
    # The overlay the fork was built with (at OVERLAY_REF), or None when HEAD does not descend from it
    built_overlay: Files | None

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


def split_patches(stream: bytes) -> list[bytes]:
    starts = [
        m.start() for m in re.finditer(re.escape(ZERO_FROM), stream) if m.start() == 0 or stream[m.start() - 1] == 10
    ]
    chunks = [stream[a:b] for a, b in zip(starts, starts[1:] + [len(stream)])]
    # format-patch separates patches with a blank line, which the last one lacks: give it one too, so that a commit
    # added after it leaves its file as it was.
    return [*chunks[:-1], chunks[-1] + b"\n"] if chunks else []


def plan_export(upstream: Upstream, fork: Path) -> ExportPlan:
    """What the repository's overlay and patches should be for the fork's HEAD."""
    if rev_parse(fork, BASE_REF) is None:
        raise ForkError(f"{fork} has no '{BASE_REF}' tag marking the pristine upstream tree")
    if git(fork, "merge-base", "--is-ancestor", BASE_REF, "HEAD", check=False).returncode != 0:
        raise ForkError(f"HEAD of {fork} does not descend from '{BASE_REF}'")
    if git_text(fork, "rev-list", "--merges", f"{BASE_REF}..HEAD"):
        raise ForkError(f"{fork} has merge commits after '{BASE_REF}'; rebase to a linear history first")
    roots = upstream.overlay_roots
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


def plan_changes(
    upstream: Upstream, plan: ExportPlan, exported: frozenset[str] = frozenset()
) -> list[tuple[str, Path, bytes | None, bool]]:
    """
    Differences between the plan and the repository: ``(action, path, content, executable)`` tuples.

    An overlay file is a three-way decision against the overlay the fork was built with: a file the fork left alone
    keeps the repository's version (even if the repository changed it since), a file only the fork changed is
    written or deleted, and a file both changed differently is a ``"conflict"``. When the fork's history no longer
    holds the overlay it was built with, the fork's version wins. A file whose repository version is the one the last
    export wrote (``exported``, overlay paths) did not change in the repository.
    """
    changes = []
    current = read_overlay(upstream)
    for rel in sorted(set(plan.overlay) | set(current)):
        ours, theirs = current.get(rel), plan.overlay.get(rel)
        built = plan.built_overlay.get(rel) if plan.built_overlay is not None and rel not in exported else ours
        if theirs == ours or theirs == built:
            continue
        action = "conflict" if ours != built else "write" if theirs is not None else "delete"
        data, executable = theirs if theirs is not None else (None, False)
        changes.append((action, repo_path(upstream, rel), data, executable))
    wanted = dict(plan.patches)
    for name, data in plan.patches:
        path = upstream.patches_dir / name
        if not path.is_file() or path.read_bytes() != data:
            changes.append(("write", path, data, False))
    if upstream.patches_dir.is_dir():
        for path in sorted(upstream.patches_dir.glob("*.patch")):
            if path.name not in wanted:
                changes.append(("delete", path, None, False))
    series = plan.series_text
    if not upstream.series_file.is_file() or upstream.series_file.read_bytes() != series:
        changes.append(("write", upstream.series_file, series, False))
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


HUNK_RE = re.compile(rb"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@.*$", re.MULTILINE)
INDEX_RE = re.compile(rb"^index [0-9a-f]+\.\.[0-9a-f]+( \d+)?\n", re.MULTILINE)


def moved_only(old: bytes, new: bytes) -> bool:
    """Whether two versions of a patch differ only in their ``index`` lines and the line numbers of their ``@@`` hunk
    headers: the same change, exported from a base that moved under it (a new upstream release)."""

    def normalized(patch: bytes) -> bytes:
        return HUNK_RE.sub(rb"@@ -\1 +\2 @@", INDEX_RE.sub(b"", patch))

    return normalized(old) == normalized(new)


def stale_patches(project: Project, upstream: Upstream, fork: Path) -> tuple[list[str], list[str]]:
    """What an export of ``fork`` would change in the repository: the patch files stale only in their ``index`` lines
    and ``@@`` line numbers (``moved_only``), and every other change, each as a line for the user."""
    moved, other = [], []
    for action, path, data, _ in plan_changes(upstream, plan_export(upstream, fork)):
        if action == "write" and path.suffix == ".patch" and path.is_file() and moved_only(path.read_bytes(), data):
            moved.append(project.rel(path))
        else:
            other.append(f"{action} {project.rel(path)}")
    return moved, other


def unexported_changes(project: Project, upstream: Upstream, fork: Path) -> list[str]:
    """Repository files that an export of ``fork`` would change (empty: everything in the fork is exported)."""
    return [
        f"{action} {project.rel(path)}" for action, path, _, _ in plan_changes(upstream, plan_export(upstream, fork))
    ]
