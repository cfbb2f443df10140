"""Errors and the git plumbing every other module uses (plain ``git`` subprocesses, reproducible settings)."""

import os
import re
import subprocess
from pathlib import Path


# Internal commits of the forks (pristine tree, overlay) use a fixed identity and date so that a rebuild gives the
# same commit ids. Nothing a maintainer sees is authored this way: `pr` and `build --clone` use the contributor's.
IDENTITY_NAME = "Workbench"
IDENTITY_EMAIL = "workbench@example.invalid"
FIXED_DATE = "2000-01-01T00:00:00+0000"
GIT_OPTIONS = ["-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "-c", "commit.gpgsign=false"]


class ForkError(Exception):
    """An error to report to the user as a plain message (no traceback)."""


class BadInput(ForkError):
    """Input a command refuses before changing anything (exit status 2)."""

    status = 2


class PatchConflict(ForkError):
    """``git am`` stopped on a patch; carries the patch name and the files that failed."""

    def __init__(self, patch: str, files: list[str], output: str, where: Path):
        self.patch = patch
        self.files = files
        self.output = output
        self.where = where
        names = ", ".join(files) if files else "(see git output above)"
        super().__init__(f"patch {patch} does not apply: {names}")


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


def contributor_env(name: str, email: str) -> dict:
    """Environment for commits a maintainer will see: the contributor as author and committer, dated now."""
    env = git_env(fixed_identity=False)
    env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email, GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email)
    return env


def contributor_identity(cwd: Path, command: str) -> tuple[str, str]:
    """``user.name`` and ``user.email`` from the contributor's own git configuration (a clear error when unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    values = {}
    for key in ("user.name", "user.email"):
        proc = subprocess.run(["git", "config", key], cwd=cwd, env=env, capture_output=True, text=True)
        values[key] = proc.stdout.strip()
    missing = [key for key, value in values.items() if not value]
    if missing:
        raise ForkError(
            f"{command}: git {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. The commits a "
            "maintainer sees are authored by you (the contributor), never by a placeholder. Set them with\n"
            '  git config --global user.name "Your Name"\n'
            "  git config --global user.email you@example.com\n"
            + (
                "or run `make pr AUTHOR='Name <email>'`."
                if command == "make pr"
                else "or pass --author 'Name <email>'."
            )
        )
    return values["user.name"], values["user.email"]


def parse_author(text: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*(.+?)\s*<([^>\s]+@[^>\s]+)>\s*", text)
    if not m:
        raise BadInput(f"--author {text!r} must look like 'Name <email>'")
    return m.group(1), m.group(2)


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


def status_paths(cwd: Path) -> list[str]:
    """Paths with uncommitted changes (tracked and untracked), as ``git status`` lists them."""
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
        paths.append(entry[3:])
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
