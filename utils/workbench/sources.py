"""Upstream sources: the pinned sdist (cached, sha256-checked, downloaded with pip) and its pristine git tree."""

import hashlib
import json
import re
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
            f"\n  got      {got}\n{hint.replace('{got}', got)}"
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
    if cached.exists():
        verify_sdist(
            project,
            upstream,
            cached,
            f"The cached file is not the pinned release (a damaged or replaced download). Delete {project.rel(cached)}"
            " and run again to download it anew (or pass --sdist PATH).",
        )
        return cached
    upstream.cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=upstream.cache_dir, prefix=".download-") as tmp:
        fresh = download_sdist(project, upstream.package, upstream.version, Path(tmp))
        # Just downloaded from the index: a mismatch means the pin is stale, and downloading again changes nothing
        stale = (
            f"The package index serves this sha256 for {upstream.package} {upstream.version}: the pin file is stale. "
            f"If that release is the one you want, put {{got}} as upstreams.{upstream.name}.sha256 (`make upgrade` "
            "writes version and hash together). Nothing was cached."
        )
        verify_sdist(project, upstream, fresh, stale)
        shutil.move(fresh, cached)
    return cached


def download_sdist(project: Project, package: str, version: str, dest: Path) -> Path:
    """Download the sdist of ``package`` ``version`` from the package index into the folder ``dest``; its path."""
    spec = f"{package}=={version}"
    print(f"Downloading the {spec} sdist from the package index ...", flush=True)
    # Only this package as an sdist: its build requirements (for the metadata pip prepares) may come as wheels.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", package, spec, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise ForkError(
            f"could not download the {spec} sdist (is the package index reachable?):\n"
            f"  {' '.join(cmd)}\n{(proc.stdout + proc.stderr).strip()}\n"
            f"Pass a local copy with --sdist PATH (it is checked against the sha256 in "
            f"{project.rel(project.config_path)}), or put it at build/cache/{package}-{version}.tar.gz."
        )
    return found[0]


def index_versions(package: str) -> list[str]:
    """The releases of ``package`` on the package index, newest first (``pip index versions``, no pre-releases)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"^Available versions: (.+)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not found:
        raise ForkError(
            f"could not read the releases of {package} from the package index (is it reachable?):\n"
            f"  {' '.join(cmd)}\n{(proc.stdout + proc.stderr).strip()}"
        )
    return [v.strip() for v in found.group(1).split(",")]


def sdist_version(tree: Path) -> str | None:
    """The ``Version:`` of an unpacked sdist's own ``PKG-INFO`` (None when it has none)."""
    try:
        text = (tree / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    found = re.search(r"^Version: *(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


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


def check_version(upstream: Upstream, sdist: Path, tree: Path) -> None:
    """Refuse an unpacked sdist whose own version (``PKG-INFO``) is not the pinned one (its tree is removed)."""
    found = sdist_version(tree)
    if found != upstream.version:
        shutil.rmtree(tree, ignore_errors=True)
        raise ForkError(
            f"{sdist} holds {upstream.package} {found or '(no PKG-INFO Version)'}, not the pinned "
            f"{upstream.version}: the cached file or the pin file is wrong (`make upgrade` writes version and hash "
            "together)"
        )


def create_pristine(upstream: Upstream, sdist: Path, dest: Path) -> None:
    """Unpack the sdist at ``dest``, ``git init`` it and commit it as tag ``upstream-base``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpack_sdist(sdist, dest)
    check_version(upstream, sdist, dest)
    git(dest, "init", "-q", "-b", FORK_BRANCH)
    (git_dir(dest) / "info").mkdir(exist_ok=True)
    (git_dir(dest) / "info" / "exclude").write_text(FORK_EXCLUDES, encoding="utf-8")
    message = f"{upstream.package} {upstream.version} (pristine sdist)\n\nsha256: {upstream.sha256}\n"
    commit_all(dest, message)
    git(dest, "tag", BASE_REF)


STOCK_STAMP = "workbench-stock.json"


def stock_dir(project: Project) -> Path:
    """Where ``build`` leaves the pristine sources of the pinned releases (``make repro`` and other tools use them)."""
    return project.root / "build" / "stock" / "src"


def build_stock(project: Project, dest: Path) -> None:
    """The pristine sources of every pinned release, ``dest/<module>/`` per upstream (``build/stock/src``), remade
    when the pins change (a stamp beside ``dest`` holds the versions and hashes it was made from)."""
    pins = {u.name: [u.package, u.version, u.sha256] for u in project.upstreams.values()}
    stamp = dest.parent / STOCK_STAMP
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == pins and dest.is_dir():
        return
    labels = ", ".join(u.label for u in project.upstreams.values())
    print(f"Unpacking the pristine sources of {labels} into {project.rel(dest)} ...", flush=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".stock-"))
    try:
        for upstream in project.upstreams.values():
            tree, sdist = staging / upstream.name, obtain_sdist(project, upstream)
            unpack_sdist(sdist, tree)
            check_version(upstream, sdist, tree)
            (staging / "src").mkdir(exist_ok=True)
            (tree / "src" / upstream.module).rename(staging / "src" / upstream.module)
        stamp.unlink(missing_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        (staging / "src").rename(dest)
        stamp.write_text(json.dumps(pins, indent=1) + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
