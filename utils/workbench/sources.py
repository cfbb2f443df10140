"""Upstream sources: the pinned sdist (cached, sha256-checked, downloaded with pip) and its pristine git tree."""

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .gitutil import ForkError, commit_all, git, git_dir
from .project import Project, Upstream


BASE_REF = "upstream-base"
FORK_BRANCH = "main"
FORK_EXCLUDES = "*.egg-info/\n__pycache__/\n*.py[cod]\n.pytest_cache/\n.ruff_cache/\n.mypy_cache/\n"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_sdist(project: Project, upstream: Upstream, path: Path, hint: str) -> None:
    got = sha256_file(path)
    if got != upstream.sha256:
        raise ForkError(
            f"sha256 mismatch for the {upstream.name} sdist {project.rel(path)}:\n"
            f"  expected {upstream.sha256} (upstreams.{upstream.name}.sha256 in {project.rel(project.config_path)})"
            f"\n  got      {got}\n{hint}"
        )


def obtain_sdist(project: Project, upstream: Upstream) -> Path:
    """The verified sdist: from ``--sdist``, else from the cache, else downloaded into the cache with pip."""
    cached = upstream.cache_dir / upstream.sdist_name
    override = upstream.sdist_override
    if override is not None:
        if not override.is_file():
            raise ForkError(f"--sdist file for {upstream.name} not found: {override}")
        verify_sdist(project, upstream, override, "Pass the sdist of the pinned version, or fix the pin file.")
        if not cached.exists():
            upstream.cache_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(override, cached)
        return override
    delete_hint = f"Delete {project.rel(cached)} and run again to download it anew (or pass --sdist PATH)."
    if cached.exists():
        verify_sdist(project, upstream, cached, delete_hint)
        return cached
    download_sdist(project, upstream, cached)
    verify_sdist(project, upstream, cached, delete_hint)
    return cached


def download_sdist(project: Project, upstream: Upstream, cached: Path) -> None:
    upstream.cache_dir.mkdir(parents=True, exist_ok=True)
    spec = f"{upstream.package}=={upstream.version}"
    print(f"Downloading the {spec} sdist from the package index ...", flush=True)
    with tempfile.TemporaryDirectory(dir=upstream.cache_dir, prefix=".download-") as tmp:
        # Only this package as an sdist: its build requirements (for the metadata pip prepares) may come as wheels.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", upstream.package, spec, "-d", tmp]
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


def create_pristine(upstream: Upstream, sdist: Path, dest: Path) -> None:
    """Unpack the sdist at ``dest``, ``git init`` it and commit it as tag ``upstream-base``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpack_sdist(sdist, dest)
    git(dest, "init", "-q", "-b", FORK_BRANCH)
    (git_dir(dest) / "info").mkdir(exist_ok=True)
    (git_dir(dest) / "info" / "exclude").write_text(FORK_EXCLUDES, encoding="utf-8")
    message = f"{upstream.package} {upstream.version} (pristine sdist)\n\nsha256: {upstream.sha256}\n"
    commit_all(dest, message)
    git(dest, "tag", BASE_REF)
