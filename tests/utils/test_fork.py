"""Tests for utils/fork.py on a small fake upstream sdist made in each test (real git, no network, no pip)."""

import hashlib
import importlib.util
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("workbench_fork", REPO_ROOT / "utils" / "fork.py")
fork = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fork)

TRAINER = "".join(f"line {i}\n" for i in range(1, 41))
UPSTREAM_FILES = {
    "pyproject.toml": "[project]\nname = 'fakepkg'\n",
    "PKG-INFO": "Name: fakepkg\nVersion: 1.0\n",
    "src/transformers/__init__.py": "__version__ = '1.0'\n",
    "src/transformers/trainer.py": TRAINER,
    "src/transformers.egg-info/SOURCES.txt": "src/transformers/__init__.py\n",
    "tests/__init__.py": "",
}
USER = ["-c", "user.name=Dev", "-c", "user.email=dev@example.invalid"]


def make_sdist(path: Path, files: dict[str, str]) -> str:
    """Write a tar.gz holding ``fakepkg-1.0/<files>`` and return its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"fakepkg-1.0/{rel}")
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, 1234, 1234, 0
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    """A fake workbench repository with the fake sdist already in its cache."""
    root = tmp_path / "repo"
    (root / "build" / "cache").mkdir(parents=True)
    sha = make_sdist(root / "build" / "cache" / "fakepkg-1.0.tar.gz", UPSTREAM_FILES)
    config = {
        "upstream": {"package": "fakepkg", "version": "1.0", "sdist": "fakepkg-1.0.tar.gz", "sha256": sha},
        "overlay": ["src/transformers", "tests/trainer", "docs/source/en"],
        "patches": "patches/transformers",
        "pins": {},
        "pr": {"fixes": "#34053"},
    }
    (root / "patches" / "transformers").mkdir(parents=True)
    (root / "patches" / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (root / "patches" / "transformers" / ".patches").write_text("", encoding="utf-8")
    write(root / "src/transformers/loss_scale.py", "def restore():\n    return 1\n")
    write(root / "tests/trainer/test_loss_scale.py", "def test_restore():\n    pass\n")
    write(root / ".gitignore", "/build/\n")
    sh(root, "git", "init", "-q")
    sh(root, "git", "add", "-A")
    sh(root, "git", *USER, "commit", "-q", "-m", "fake workbench")
    return root


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def run(root: Path, *args: str, install: bool = False) -> int:
    argv = [args[0], "--repo-root", str(root), *args[1:]]
    if args[0] == "build" and not install:
        argv.append("--no-install")
    return fork.main(argv)


def sh(cwd: Path, *cmd: str) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def fork_dir(root: Path) -> Path:
    return root / "build" / "transformers"


def commit_in_fork(root: Path, message: str, edits: dict[str, str]) -> None:
    for rel, text in edits.items():
        write(fork_dir(root) / rel, text)
    sh(fork_dir(root), "git", "add", "-A")
    sh(fork_dir(root), "git", *USER, "commit", "-q", "-m", message)


def exported_files(root: Path) -> dict[str, bytes]:
    """Every file the export owns: the overlay and the patches folder."""
    paths = [p for d in ("src", "tests/trainer", "patches/transformers") for p in (root / d).rglob("*") if p.is_file()]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(paths)}


def make_patch(root: Path) -> Path:
    """Build, change trainer.py in the fork, export; return the single patch file."""
    assert run(root, "build") == 0
    trainer = TRAINER.replace("line 20\n", "line 20 patched\n")
    commit_in_fork(
        root,
        "Patch the trainer\n\nWhy: exact fp16 resume. Meant for upstream.",
        {"src/transformers/trainer.py": trainer},
    )
    assert run(root, "export") == 0
    (patch,) = (root / "patches" / "transformers").glob("*.patch")
    return patch


def test_build_creates_pristine_base_overlay_and_is_then_a_no_op(project, capsys):
    assert run(project, "build") == 0
    fork_path = fork_dir(project)
    assert sh(fork_path, "git", "rev-list", "--count", "HEAD").strip() == "2"
    base_files = sh(fork_path, "git", "ls-tree", "-r", "--name-only", "upstream-base").split()
    assert "src/transformers/trainer.py" in base_files
    assert not any("egg-info" in f for f in base_files), "build artifacts are not part of the pristine commit"
    assert (fork_path / "src/transformers/loss_scale.py").read_text(encoding="utf-8").startswith("def restore")
    assert (fork_path / "src/transformers.egg-info/SOURCES.txt").exists()
    assert sh(fork_path, "git", "status", "--porcelain") == ""
    head = sh(fork_path, "git", "rev-parse", "HEAD")

    capsys.readouterr()
    assert run(project, "build") == 0
    assert "nothing to do" in capsys.readouterr().out
    assert sh(fork_path, "git", "rev-parse", "HEAD") == head


def test_build_is_reproducible(project, tmp_path):
    assert run(project, "build") == 0
    assert run(project, "build", "--fork-dir", str(tmp_path / "other")) == 0
    assert sh(fork_dir(project), "git", "rev-parse", "HEAD") == sh(tmp_path / "other", "git", "rev-parse", "HEAD")


def test_edit_export_rebuild_round_trip_is_byte_stable(project, capsys):
    patch = make_patch(project)
    commit_in_fork(
        project,
        "Add docs and change the module",
        {
            "docs/source/en/loss_scale.md": "# Loss scale\n",
            "src/transformers/loss_scale.py": "def restore():\n    return 2\n",
        },
    )
    assert run(project, "export") == 0
    assert (project / "patches/transformers/.patches").read_text(encoding="utf-8") == patch.name + "\n"
    assert "return 2" in (project / "src/transformers/loss_scale.py").read_text(encoding="utf-8")
    assert (project / "docs/source/en/loss_scale.md").exists()
    text = patch.read_text(encoding="utf-8")
    assert text.startswith(fork.ZERO_FROM.decode()) and "Subject: Patch the trainer\n" in text
    assert "+line 20 patched" in text and "loss_scale" not in text, "overlay changes stay out of the patches"
    first = exported_files(project)

    capsys.readouterr()
    assert run(project, "build") == 0  # everything is exported: nothing to do
    assert "nothing to do" in capsys.readouterr().out

    (project / "build/transformers").rename(project / "build/old")
    assert run(project, "build") == 0
    assert run(project, "export") == 0
    assert exported_files(project) == first
    assert run(project, "check") == 0


def test_export_leaves_build_artifacts_out_of_patches(project):
    assert run(project, "build") == 0
    write(fork_dir(project) / "src/transformers.egg-info/SOURCES.txt", "rewritten by pip install -e\n")
    sh(fork_dir(project), "git", "add", "-f", "src/transformers.egg-info/SOURCES.txt")
    sh(fork_dir(project), "git", *USER, "commit", "-q", "-m", "Only an artifact")
    assert run(project, "export") == 0
    assert list((project / "patches/transformers").glob("*.patch")) == []


def test_export_removes_deleted_overlay_files_and_stale_patches(project):
    make_patch(project)
    sh(fork_dir(project), "git", "reset", "-q", "--hard", "upstream-base")  # drop the overlay and the patch
    commit_in_fork(project, "Only a module", {"src/transformers/loss_scale.py": "x = 1\n"})
    assert run(project, "export") == 0
    assert (project / "src/transformers/loss_scale.py").read_text(encoding="utf-8") == "x = 1\n"
    assert not (project / "tests/trainer").exists()
    assert list((project / "patches/transformers").glob("*.patch")) == []
    assert (project / "patches/transformers/.patches").read_bytes() == b""


def test_export_keeps_repository_changes_to_files_the_fork_left_alone(project):
    assert run(project, "build") == 0
    write(project / "src/transformers/loss_scale.py", "edited in the repo, not committed\n")
    write(project / "tests/trainer/test_new.py", "untracked, not in the fork\n")
    commit_in_fork(project, "Fork work\n\nWhy: a test patch.", {"src/transformers/trainer.py": "changed\n"})
    assert run(project, "export") == 0
    loss_scale = project / "src/transformers/loss_scale.py"
    assert loss_scale.read_text(encoding="utf-8") == "edited in the repo, not committed\n"
    assert (project / "tests/trainer/test_new.py").read_text(encoding="utf-8") == "untracked, not in the fork\n"
    assert len(list((project / "patches/transformers").glob("*.patch"))) == 1

    # Committed in the repository after the build: the fork still holds the old version, which must not win.
    sh(project, "git", "add", "-A")
    sh(project, "git", *USER, "commit", "-q", "-m", "save the repo work")
    commit_in_fork(project, "More fork work\n\nWhy: a test patch.", {"src/transformers/trainer.py": "again\n"})
    assert run(project, "export") == 0
    assert loss_scale.read_text(encoding="utf-8") == "edited in the repo, not committed\n"


@pytest.mark.parametrize("committed", [False, True])
def test_export_refuses_overlay_files_changed_on_both_sides(project, capsys, committed):
    assert run(project, "build") == 0
    loss_scale = project / "src/transformers/loss_scale.py"
    write(loss_scale, "repository version\n")
    if committed:
        sh(project, "git", *USER, "commit", "-q", "-am", "repository edit")
    commit_in_fork(project, "Fork edit", {"src/transformers/loss_scale.py": "fork version\n"})
    assert run(project, "export") == 1
    err = capsys.readouterr().err
    assert "changed both in the repository" in err and "src/transformers/loss_scale.py" in err
    assert loss_scale.read_text(encoding="utf-8") == "repository version\n"
    assert run(project, "export", "--force") == 0
    assert loss_scale.read_text(encoding="utf-8") == "fork version\n"


def test_export_refuses_uncommitted_changes(project, capsys):
    assert run(project, "build") == 0
    write(fork_dir(project) / "src/transformers/trainer.py", "edited\n")
    assert run(project, "export") == 1
    err = capsys.readouterr().err
    assert "src/transformers/trainer.py" in err and "commit them inside the fork" in err


def test_build_refuses_to_clobber_uncommitted_edits(project, capsys):
    assert run(project, "build") == 0
    edited = fork_dir(project) / "src/transformers/trainer.py"
    edited.write_text("my work\n", encoding="utf-8")
    write(project / "src/transformers/loss_scale.py", "changed in the repo\n")  # so build has work to do
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "uncommitted changes: src/transformers/trainer.py" in err and "--force" in err
    assert edited.read_text(encoding="utf-8") == "my work\n"

    assert run(project, "build", "--force") == 0
    assert (project / "build/transformers.backup-1/src/transformers/trainer.py").read_text(
        encoding="utf-8"
    ) == "my work\n"
    assert (fork_dir(project) / "src/transformers/loss_scale.py").read_text(
        encoding="utf-8"
    ) == "changed in the repo\n"


def test_build_refuses_unexported_commits(project, capsys):
    assert run(project, "build") == 0
    commit_in_fork(project, "Work", {"src/transformers/trainer.py": "work\n"})
    write(project / "src/transformers/loss_scale.py", "changed in the repo\n")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "not exported" in err and "patches/transformers/work.patch" in err


def test_rebuild_after_series_change_reuses_the_fork(project):
    patch = make_patch(project)
    saved = patch.read_bytes()
    sh(fork_dir(project), "git", "reset", "-q", "--hard", "HEAD~1")
    assert run(project, "export") == 0  # the patch is gone again
    patch.write_bytes(saved)
    (project / "patches/transformers/.patches").write_text(patch.name + "\n", encoding="utf-8")
    assert run(project, "build") == 0
    assert "line 20 patched" in (fork_dir(project) / "src/transformers/trainer.py").read_text(encoding="utf-8")
    assert not list(project.glob("build/transformers.backup-*"))


def test_sha256_mismatch_of_cached_sdist_is_a_clear_error(project, capsys):
    cached = project / "build/cache/fakepkg-1.0.tar.gz"
    config = json.loads((project / "patches/config.json").read_text(encoding="utf-8"))
    config["upstream"]["sha256"] = "0" * 64
    (project / "patches/config.json").write_text(json.dumps(config), encoding="utf-8")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    got = hashlib.sha256(cached.read_bytes()).hexdigest()
    assert "sha256 mismatch for build/cache/fakepkg-1.0.tar.gz" in err
    assert (
        f"expected {'0' * 64}" in err and f"got      {got}" in err and "Delete build/cache/fakepkg-1.0.tar.gz" in err
    )
    assert cached.exists() and not fork_dir(project).exists()


def test_sdist_option_is_verified_and_cached(project, tmp_path, capsys):
    cached = project / "build/cache/fakepkg-1.0.tar.gz"
    good = tmp_path / "good.tar.gz"
    cached.rename(good)
    bad = tmp_path / "bad.tar.gz"
    make_sdist(bad, {"x": "y"})
    assert run(project, "build", "--sdist", str(bad)) == 1
    assert f"sha256 mismatch for {bad}" in capsys.readouterr().err
    assert run(project, "build", "--sdist", str(good)) == 0
    assert cached.read_bytes() == good.read_bytes()


def test_unreachable_index_says_how_to_pass_a_local_sdist(project, monkeypatch, capsys):
    (project / "build/cache/fakepkg-1.0.tar.gz").unlink()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "could not download the fakepkg==1.0 sdist" in err and "--sdist PATH" in err


def test_check_passes_and_catches_a_stale_patch(project, capsys):
    patch = make_patch(project)
    assert run(project, "check") == 0
    text = patch.read_text(encoding="utf-8")
    assert "@@ -17,7 +17,7 @@" in text
    patch.write_text(text.replace("@@ -17,7 +17,7 @@", "@@ -15,7 +15,7 @@"), encoding="utf-8")  # applies with offset
    capsys.readouterr()
    assert run(project, "check") == 1
    err = capsys.readouterr().err
    assert f"re-exporting would write patches/transformers/{patch.name}" in err


def test_check_catches_a_patch_that_does_not_apply(project, capsys):
    patch = make_patch(project)
    patch.write_text(patch.read_text(encoding="utf-8").replace(" line 19\n", " line nineteen\n"), encoding="utf-8")
    assert run(project, "check") == 1
    err = capsys.readouterr().err
    assert f"patches/transformers/{patch.name} does not apply cleanly" in err and "src/transformers/trainer.py" in err
    assert sh(fork_dir(project), "git", "status", "--porcelain") == "", "check never touches the fork"


def test_check_lints_series_and_descriptions(project, capsys):
    patch = make_patch(project)
    text = patch.read_text(encoding="utf-8")
    no_body = text.replace("\nWhy: exact fp16 resume. Meant for upstream.\n", "")
    (project / "patches/transformers/no_body.patch").write_text(no_body, encoding="utf-8")
    patch.write_text(text.replace("Meant for upstream.", "Meant for upstream.  "), encoding="utf-8")
    series = f"{patch.name}\nno_body.patch\nmissing.patch\n"
    (project / "patches/transformers/.patches").write_text(series, encoding="utf-8")
    (project / "patches/transformers/unlisted.patch").write_text(text, encoding="utf-8")
    assert run(project, "check") == 1
    err = capsys.readouterr().err
    assert "no_body.patch has no description" in err
    assert f"{patch.name} has trailing whitespace in its description" in err
    assert "lists missing.patch, but patches/transformers/missing.patch does not exist" in err
    assert "patches/transformers/unlisted.patch is not listed in patches/transformers/.patches" in err


def test_build_stops_on_a_conflict_in_git_am_state(project, capsys):
    patch = make_patch(project)
    patch.write_text(patch.read_text(encoding="utf-8").replace(" line 19\n", " line nineteen\n"), encoding="utf-8")
    assert run(project, "build", "--force") == 1
    err = capsys.readouterr().err
    assert f"Patch patches/transformers/{patch.name} did not apply to: src/transformers/trainer.py" in err
    assert "git am --continue" in err
    assert (fork_dir(project) / ".git/rebase-apply").is_dir()
    assert run(project, "build") == 1
    assert "`git am` is in progress" in capsys.readouterr().err


def test_pr_series_applies_to_the_pristine_sdist(project, tmp_path):
    make_patch(project)
    write(project / "docs/pr_body.md", "## Before / after\n\nLoss curves match.\n")
    out = tmp_path / "dist"
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 0
    description = (out / "PR_DESCRIPTION.md").read_text(encoding="utf-8")
    for heading in ("## What does this PR do?", "## Before / after", "## Before submitting", "## Who can review?"):
        assert heading in description
    assert "Fixes #34053" in description and "Loss curves match." in description
    assert "python -m pytest tests/trainer/test_loss_scale.py" in description

    upstream = tmp_path / "upstream"
    upstream.mkdir()
    with tarfile.open(project / "build/cache/fakepkg-1.0.tar.gz") as tar:
        tar.extractall(upstream, filter="data")
    pristine = upstream / "fakepkg-1.0"
    sh(pristine, "git", "init", "-q")
    sh(pristine, "git", "add", "-A")
    sh(pristine, "git", *USER, "commit", "-q", "-m", "pristine")
    sh(pristine, "git", *USER, "am", *sorted(str(p) for p in out.glob("*.patch")))
    assert "Jane Doe" in sh(pristine, "git", "log", "--format=%an")

    def tree(path):  # the sdist's build artifacts (*.egg-info) are not in the fork's pristine commit
        return [line for line in sh(path, "git", "ls-tree", "-r", "HEAD").splitlines() if "egg-info" not in line]

    assert tree(pristine) == tree(fork_dir(project))


def test_build_on_an_existing_clone_makes_a_branch(project, tmp_path):
    make_patch(project)
    clone = tmp_path / "clone"
    clone.mkdir()
    make_sdist(tmp_path / "up.tar.gz", UPSTREAM_FILES)
    with tarfile.open(tmp_path / "up.tar.gz") as tar:
        tar.extractall(clone, filter="data")
    clone = clone / "fakepkg-1.0"
    sh(clone, "git", "init", "-q", "-b", "main")
    sh(clone, "git", "add", "-A")
    sh(clone, "git", *USER, "commit", "-q", "-m", "upstream main")
    assert run(project, "build", "--clone", str(clone), "--branch", "pr") == 0
    assert sh(clone, "git", "branch", "--show-current").strip() == "pr"
    assert sh(clone, "git", "rev-list", "--count", "main..pr").strip() == "2"
    assert "line 20 patched" in (clone / "src/transformers/trainer.py").read_text(encoding="utf-8")
    assert run(project, "build", "--clone", str(clone), "--branch", "pr") == 1  # the branch exists now
