"""The overlay: new files of the PRs, kept in the repository at their upstream paths and copied into a fork as is.

Overlay paths are upstream paths (``src/transformers/trainer_loss_scale.py``); the repository file is
``<repo_dir>/<path>`` (``repo_dir`` is the repository root for transformers).
"""

import os
from pathlib import Path

from .gitutil import ForkError, commit_all, ls_tree
from .project import Upstream


# Build artifacts that never belong to the overlay and never count as edits in a fork.
SKIP_DIR_NAMES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}
SKIP_FILE_SUFFIXES = (".pyc", ".pyo", ".swp", "~")
SKIP_FILE_NAMES = {".DS_Store"}

Files = dict[str, tuple[bytes, bool]]  # {upstream path: (content, executable)}


def is_skipped(rel_path: str) -> bool:
    """Whether a path is a build artifact that never belongs to the overlay."""
    parts = rel_path.split("/")
    if any(part in SKIP_DIR_NAMES or part.endswith(".egg-info") for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in SKIP_FILE_NAMES or name.endswith(SKIP_FILE_SUFFIXES)


def under_roots(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def repo_path(upstream: Upstream, path: str) -> Path:
    """Where the overlay file with upstream path ``path`` lives in the repository."""
    return upstream.repo_dir / path


def read_overlay(upstream: Upstream) -> Files:
    """The overlay files of the repository for ``upstream``, sorted by upstream path."""
    files = {}
    for root in upstream.overlay_roots:
        base = upstream.repo_dir / root
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIR_NAMES)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                rel = path.relative_to(upstream.repo_dir).as_posix()
                if is_skipped(rel):
                    continue
                if path.is_symlink() or not path.is_file():
                    raise ForkError(f"overlay file {path} is not a regular file (links are not supported)")
                files[rel] = (path.read_bytes(), os.access(path, os.X_OK))
    return dict(sorted(files.items()))


def add_overlay(fork: Path, files: Files, message: str, env: dict | None = None) -> None:
    """Copy ``files`` into ``fork`` and commit them as one commit (refusing to overwrite files of the tree)."""
    if not files:
        return
    existing = ls_tree(fork, "HEAD")
    clashes = [rel for rel in files if rel in existing]
    if clashes:
        raise ForkError(
            "overlay files exist upstream already (changes to upstream files must be patches): " + ", ".join(clashes)
        )
    for rel, (data, executable) in files.items():
        path = fork / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if executable else 0o644)
    commit_all(fork, message, env=env, paths=list(files))
