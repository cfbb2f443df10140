"""Tests for the workbench (utils/fork.py, utils/workbench/) on small fake upstream sdists made in each test: a fake
transformers and a fake accelerate (real git, no network, no pip)."""

import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from workbench import cli as fork  # noqa: E402
from workbench import texts  # noqa: E402
from workbench.pr import waits_for  # noqa: E402
from workbench.project import load_project  # noqa: E402
from workbench.series import ZERO_FROM  # noqa: E402
from workbench.stack import PR  # noqa: E402
from workbench.texts import POLICY_URL, TEMPLATES, Comment, Outside  # noqa: E402


TRAINER = "".join(f"line {i}\n" for i in range(1, 41))
UPSTREAM_FILES = {
    "pyproject.toml": "[project]\nname = 'fakepkg'\n",
    "PKG-INFO": "Name: fakepkg\nVersion: 1.0\n",
    "src/transformers/__init__.py": "__version__ = '1.0'\n",
    "src/transformers/trainer.py": TRAINER,
    "src/transformers.egg-info/SOURCES.txt": "src/transformers/__init__.py\n",
    "tests/__init__.py": "",
}
OPTIMIZER = "".join(f"step {i}\n" for i in range(1, 31))
ACCELERATE_FILES = {
    "pyproject.toml": "[project]\nname = 'fakeacc'\n",
    "PKG-INFO": "Name: fakeacc\nVersion: 1.0\n",
    "src/fakeacc/__init__.py": "",
    "src/fakeacc/optimizer.py": OPTIMIZER,
    "tests/test_optimizer.py": "def test_step():\n    pass\n",
}
USER = ["-c", "user.name=Dev", "-c", "user.email=dev@example.invalid"]
PR1 = "trainer-loss-scale"


def description(what: str, upstream: str = "transformers") -> str:
    """A PR description in its upstream's current template (what `check` asks of every description)."""
    bodies = {"# What does this PR do?": what, "## Code Agent Policy": f"[Policy]({POLICY_URL})\n\n- [ ] I confirm."}
    return "\n\n".join(f"{heading}\n\n{bodies.get(heading, '')}".strip() for heading in TEMPLATES[upstream]) + "\n"


LOSS_SCALE_FILES = ["src/transformers/loss_scale.py", "tests/trainer/test_loss_scale.py"]


def make_sdist(path: Path, files: dict[str, str], top: str = "fakepkg-1.0") -> str:
    """Write a tar.gz holding ``<top>/<files>`` and return its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, 1234, 1234, 0
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    """A fake workbench repository with both fake sdists already in its cache and a one-PR stack."""
    root = tmp_path / "repo"
    (root / "build" / "cache").mkdir(parents=True)
    sha = make_sdist(root / "build" / "cache" / "fakepkg-1.0.tar.gz", UPSTREAM_FILES)
    acc_sha = make_sdist(root / "build" / "cache" / "fakeacc-1.0.tar.gz", ACCELERATE_FILES, "fakeacc-1.0")
    config = {
        "upstreams": {
            "transformers": {
                "package": "fakepkg",
                "module": "transformers",
                "version": "1.0",
                "sha256": sha,
                "overlay": ["src/transformers", "tests/trainer", "docs/source/en"],
                "patches": "patches/transformers",
            },
            "accelerate": {
                "package": "fakeacc",
                "version": "1.0",
                "sha256": acc_sha,
                "repo_dir": "accelerate",
                "overlay": ["src/fakeacc", "tests"],
                "patches": "patches/accelerate",
            },
        },
        "pins": {},
        "stack": "patches/stack.json",
    }
    for name in ("transformers", "accelerate"):
        (root / "patches" / name).mkdir(parents=True)
        (root / "patches" / name / ".patches").write_text("", encoding="utf-8")
    (root / "patches" / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    write(root / "src/transformers/loss_scale.py", "def restore():\n    return 1\n")
    write(
        root / "tests/trainer/test_loss_scale.py",
        "from transformers.loss_scale import restore\n\n\ndef test_restore():\n    assert restore() == 1\n",
    )
    write_text(root / "docs/pr/trainer-loss-scale.md", description("Restores the loss scale."))
    set_stack(root, [pr_entry(PR1, overlay=LOSS_SCALE_FILES, tests=["tests/trainer/test_loss_scale.py"])])
    write(root / ".gitignore", "/build/\n/dist/\n")
    sh(root, "git", "init", "-q")
    sh(root, "git", "add", "-A")
    sh(root, "git", *USER, "commit", "-q", "-m", "fake workbench")
    return root


def pr_entry(name: str, upstream: str = "transformers", **fields) -> dict:
    entry = {"name": name, "upstream": upstream, "title": f"Title of {name}", "patches": [], "overlay": []}
    entry.update(tests=[f"tests/test_{name}.py"], description=f"docs/pr/{name}.md")
    entry.update(fields)
    return entry


def set_stack(root: Path, entries: list[dict]) -> None:
    write(root / "patches/stack.json", json.dumps(entries, indent=2))


def add_to_stack(root: Path, name: str, **lists) -> None:
    """Append to the lists of the stack entry ``name``."""
    entries = json.loads((root / "patches/stack.json").read_text(encoding="utf-8"))
    entry = next(e for e in entries if e["name"] == name)
    for key, values in lists.items():
        entry[key] = entry.get(key, []) + values
    set_stack(root, entries)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_text(path: Path, text: str) -> None:
    """An upstream-bound text and its claims file beside it (every text needs one): its first line, read."""
    write(path, text)
    claim = {"claim": text.splitlines()[0], "evidence": "read: owner/repo@1.0 src/x.py:1 says so"}
    write(texts.claims_path(path), json.dumps({"claims": [claim]}))


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


def fake_venv(tmp_path: Path) -> Path:
    """A virtual environment whose python is this one (for the level tests)."""
    venv = tmp_path / "venv"
    if not (venv / "bin/python").exists():  # one per test, however many commands it runs
        (venv / "bin").mkdir(parents=True)
        (venv / "bin/python").symlink_to(sys.executable)
    return venv


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
    add_to_stack(root, PR1, patches=[patch.name])
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
    # --force rebuilds all the same (it said "up to date", and a fork holding a file no build makes kept it)
    write(fork_path / "tests/stale_test.py", "def test_stale(): pass\n")
    assert run(project, "build", "--force") == 0
    assert "nothing to do" not in capsys.readouterr().out
    assert sh(fork_path, "git", "rev-parse", "HEAD") == head and not (fork_path / "tests/stale_test.py").exists()
    assert (project / "build/transformers.backup-1/tests/stale_test.py").exists()  # not the build's: kept aside


def test_build_is_reproducible(project, tmp_path):
    assert run(project, "build") == 0
    assert run(project, "build", "--upstream", "transformers", "--fork-dir", str(tmp_path / "other")) == 0
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
    add_to_stack(project, PR1, overlay=["docs/source/en/loss_scale.md"])
    assert (project / "patches/transformers/.patches").read_text(encoding="utf-8") == patch.name + "\n"
    assert "return 2" in (project / "src/transformers/loss_scale.py").read_text(encoding="utf-8")
    assert (project / "docs/source/en/loss_scale.md").exists()
    text = patch.read_text(encoding="utf-8")
    assert text.startswith(ZERO_FROM.decode()) and "Subject: Patch the trainer\n" in text
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


def test_an_overlay_file_edited_again_in_the_fork_after_its_export_is_exported(project):
    assert run(project, "build") == 0
    loss_scale = project / "src/transformers/loss_scale.py"
    for version in ("first fork version\n", "second fork version\n"):
        commit_in_fork(project, "Fork edit", {"src/transformers/loss_scale.py": version})
        assert run(project, "export") == 0
        assert loss_scale.read_text(encoding="utf-8") == version
        sh(project, "git", *USER, "commit", "-q", "-am", "exported")
    # A repository change after that export is still a conflict with a further fork edit
    write(loss_scale, "repository version\n")
    commit_in_fork(project, "Fork edit", {"src/transformers/loss_scale.py": "third fork version\n"})
    assert run(project, "export") == 1


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
    config["upstreams"]["transformers"]["sha256"] = "0" * 64
    (project / "patches/config.json").write_text(json.dumps(config), encoding="utf-8")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    got = hashlib.sha256(cached.read_bytes()).hexdigest()
    assert "sha256 mismatch for the transformers sdist build/cache/fakepkg-1.0.tar.gz" in err
    assert "upstreams.transformers.sha256 in patches/config.json" in err
    assert (
        f"expected {'0' * 64}" in err and f"got      {got}" in err and "Delete build/cache/fakepkg-1.0.tar.gz" in err
    )
    assert "The cached file is not the pinned release" in err
    assert cached.exists() and not fork_dir(project).exists()


def test_sdist_option_is_verified_and_cached(project, tmp_path, capsys):
    cached = project / "build/cache/fakepkg-1.0.tar.gz"
    good = tmp_path / "good.tar.gz"
    cached.rename(good)
    bad = tmp_path / "bad.tar.gz"
    make_sdist(bad, {"x": "y"})
    assert run(project, "build", "--sdist", f"transformers={bad}") == 1
    assert f"sha256 mismatch for the transformers sdist {bad}" in capsys.readouterr().err
    assert run(project, "build", "--sdist", str(good)) == 1  # two upstreams: say which one
    assert "as UPSTREAM=PATH" in capsys.readouterr().err
    assert run(project, "build", "--upstream", "transformers", "--sdist", str(good)) == 0
    assert cached.read_bytes() == good.read_bytes()


def test_unreachable_index_says_how_to_pass_a_local_sdist(project, monkeypatch, capsys):
    (project / "build/cache/fakepkg-1.0.tar.gz").unlink()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "could not download the fakepkg==1.0 sdist" in err and "--sdist PATH" in err


def test_check_passes_and_catches_a_stale_patch(project, tmp_path, capsys):
    patch = make_patch(project)
    assert run(project, "check") == 0
    text = patch.read_text(encoding="utf-8")
    assert "@@ -17,7 +17,7 @@" in text
    patch.write_text(text.replace("@@ -17,7 +17,7 @@", "@@ -15,7 +15,7 @@"), encoding="utf-8")  # applies with offset
    capsys.readouterr()
    assert run(project, "check", "--venv", str(fake_venv(tmp_path)), "--tests", "--pytest-args=-q") == 1
    out, err = capsys.readouterr()
    assert (
        f"FAIL: patches/transformers/{patch.name} is stale only in its `index` lines and `@@` line numbers (the "
        "fakepkg 1.0 base moved under it): run `make patches` to rewrite it"
    ) in err
    assert "re-exporting would" not in err
    # The same change: its PR's tests still run, with its fix and without it
    assert f"== PR {PR1}: its tests pass at its level" in out
    assert f"== PR {PR1}: its tests fail without its fix" in out
    patch.write_text(text + "-- \n2.40.0\n\n", encoding="utf-8")  # a signature: more than index lines and offsets
    assert run(project, "check") == 1
    assert f"re-exporting would write patches/transformers/{patch.name} (run `make fork`" in capsys.readouterr().err


def test_check_catches_a_patch_that_does_not_apply(project, capsys):
    patch = make_patch(project)
    patch.write_text(patch.read_text(encoding="utf-8").replace(" line 19\n", " line nineteen\n"), encoding="utf-8")
    assert run(project, "check") == 1
    err = capsys.readouterr().err
    assert (
        f"PR {PR1}: patch patches/transformers/{patch.name} does not apply on the PRs below it in patches/stack.json, "
        "fakepkg 1.0 (failed" in err
    )
    assert "(failed: src/transformers/trainer.py)" in err
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


def pristine_checkout(tmp_path: Path, sdist: Path, name: str) -> Path:
    """The sdist unpacked, ``git init``ed and committed, as a contributor would start."""
    upstream = tmp_path / f"upstream-{name}"
    upstream.mkdir()
    with tarfile.open(sdist) as tar:
        tar.extractall(upstream, filter="data")
    (pristine,) = upstream.iterdir()
    sh(pristine, "git", "init", "-q", "-b", "main")
    sh(pristine, "git", "add", "-A")
    sh(pristine, "git", *USER, "commit", "-q", "-m", "pristine")
    return pristine


def tree(path: Path) -> list[str]:  # the sdist's build artifacts (*.egg-info) are not in the fork's pristine commit
    return [line for line in sh(path, "git", "ls-tree", "-r", "HEAD").splitlines() if "egg-info" not in line]


def make_stack(root: Path) -> dict[str, Path]:
    """Three PRs over two upstreams: PR1 (overlay + trainer patch), PR2 (a second trainer patch, its own test, on top
    of PR1) and an accelerate PR (a patch with a test hunk). Returns the patch files by PR."""
    patch1 = make_patch(root)
    trainer = (fork_dir(root) / "src/transformers/trainer.py").read_text(encoding="utf-8")
    commit_in_fork(
        root,
        "Log the scale\n\nWhy: visibility. Meant for upstream.",
        {"src/transformers/trainer.py": trainer.replace("line 21\n", "line 21 logged\n")},
    )
    commit_in_fork(
        root,
        "Test the logging",
        {
            "tests/trainer/test_logging.py": "from pathlib import Path\n\nimport transformers\n\n\ndef test_logged():\n"
            "    assert 'line 21 logged' in (Path(transformers.__file__).parent / 'trainer.py').read_text()\n"
        },
    )
    acc = root / "build/accelerate"
    write(acc / "src/fakeacc/optimizer.py", OPTIMIZER.replace("step 10\n", "step 10 skipped\n"))
    write(
        acc / "tests/test_optimizer.py",
        "from pathlib import Path\n\nimport fakeacc\n\n\ndef test_step():\n"
        "    assert 'skipped' in (Path(fakeacc.__file__).parent / 'optimizer.py').read_text()\n",
    )
    sh(acc, "git", "add", "-A")
    sh(acc, "git", *USER, "commit", "-q", "-m", "Detect skips\n\nWhy: fused optimizers. Meant for upstream.")
    assert run(root, "export") == 0
    series = (root / "patches/transformers/.patches").read_text(encoding="utf-8").split()
    assert series[0] == patch1.name and len(series) == 2
    (acc_patch,) = (root / "patches/accelerate").glob("*.patch")
    write_text(root / "docs/pr/trainer-logging.md", description("Logs the scale."))
    write_text(root / "docs/pr/accelerate-skips.md", description("Detects skips.", "accelerate"))
    write(root / "docs/source/en/loss_scale.md", "# Loss scale on resume\n\nText.\n")
    entries = json.loads((root / "patches/stack.json").read_text(encoding="utf-8"))
    entries[0]["overlay"].append("docs/source/en/loss_scale.md")
    entries.insert(
        0, pr_entry("accelerate-skips", "accelerate", patches=[acc_patch.name], tests=["tests/test_optimizer.py"])
    )
    entries.append(
        pr_entry(
            "trainer-logging",
            patches=[series[1]],
            overlay=["tests/trainer/test_logging.py"],
            tests=["tests/trainer/test_logging.py"],
            depends_on=[PR1, "accelerate-skips"],
        )
    )
    set_stack(root, entries)
    sh(root, "git", "add", "-A")
    sh(root, "git", *USER, "commit", "-q", "-m", "the stack")
    assert run(root, "build") == 0
    return {PR1: patch1, "trainer-logging": root / "patches/transformers" / series[1], "accelerate-skips": acc_patch}


def test_pr_writes_one_folder_per_pr_that_applies_at_its_level(project, tmp_path, capsys):
    make_stack(project)
    out = tmp_path / "dist"
    capsys.readouterr()
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 0
    printed = capsys.readouterr().out
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["01-accelerate-skips", f"02-{PR1}", "03-trainer-logging"]
    assert (out / f"02-{PR1}/PR_DESCRIPTION.md").read_text(encoding="utf-8") == description("Restores the loss scale.")
    assert "  - local: loss_scale\n    title: Loss scale on resume" in printed
    assert "_toctree.yml" in (out / "README.md").read_text(encoding="utf-8")

    # Each series applies with git am onto its pristine base plus the PRs it depends on, authored by the contributor
    cache = project / "build/cache"
    trans = pristine_checkout(tmp_path, cache / "fakepkg-1.0.tar.gz", "transformers")
    for folder in folders[1:]:
        sh(trans, "git", *USER, "am", *sorted(str(p) for p in (out / folder).glob("*.patch")))
    assert tree(trans) == tree(fork_dir(project))
    acc = pristine_checkout(tmp_path, cache / "fakeacc-1.0.tar.gz", "accelerate")
    sh(acc, "git", *USER, "am", *sorted(str(p) for p in (out / folders[0]).glob("*.patch")))
    assert tree(acc) == tree(project / "build/accelerate")
    for repo in (trans, acc):
        authors = set(sh(repo, "git", "log", "--format=%an <%ae>|%cn", "main~1..").splitlines())
        assert authors == {"Jane Doe <jane@example.invalid>|Dev"}, "no placeholder identity reaches a maintainer"
    dates = sh(trans, "git", "log", "--format=%ad", "--date=format:%Y", "-1")
    assert dates.strip() != "2000"
    patches = "".join(p.read_text(encoding="utf-8") for p in out.rglob("*.patch"))
    assert "example.invalid>" in patches and "team@" not in patches and "Workbench" not in patches


def test_pr_needs_the_contributor_identity_and_leaves_dist_alone(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    out = tmp_path / "dist"
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    capsys.readouterr()
    assert run(project, "pr", "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "git user.name and user.email are not set" in err and "git config --global user.email" in err
    assert "or run `make pr AUTHOR='Name <email>'`." in err  # the make variable that passes --author
    sh(project, "git", "config", "user.name", "Local Dev")
    sh(project, "git", "config", "user.email", "local@example.invalid")
    # A series that does not apply at its level, found while writing: nothing in dist/ changes
    stacks = make_stack_patches(project)
    acc_patch = stacks["accelerate-skips"]
    acc_patch.write_text(acc_patch.read_text(encoding="utf-8").replace(" step 9\n", " step nine\n"), encoding="utf-8")
    assert run(project, "pr", "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert f"PR accelerate-skips: patch patches/accelerate/{acc_patch.name} does not apply on the PRs below it" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dist")] == []
    acc_patch.write_text(acc_patch.read_text(encoding="utf-8").replace(" step nine\n", " step 9\n"), encoding="utf-8")
    assert run(project, "pr", "--out", str(out)) == 0
    assert "Author: Local Dev" not in (out / "README.md").read_text(encoding="utf-8")
    assert "From: Local Dev <local@example.invalid>" in next((out / f"02-{PR1}").glob("*.patch")).read_text(
        encoding="utf-8"
    )


def make_stack_patches(root: Path) -> dict[str, Path]:
    entries = json.loads((root / "patches/stack.json").read_text(encoding="utf-8"))
    return {e["name"]: root / "patches" / e["upstream"] / e["patches"][0] for e in entries if e["patches"]}


def test_check_runs_each_prs_tests_at_its_level(project, tmp_path, capsys):
    make_stack(project)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    args = ["--venv", str(venv), "--tests", "--pytest-args=-q"]
    # A text's reproduction runs on the pinned sdist's sources (texts.py, repros.py)
    repro = "```python\nimport transformers\nprint('on', transformers.__version__)\n```\n"
    write_text(
        project / "docs/issues/transformers-x.md",
        f"# X\n\n{repro}\n<!-- output: stock -->\n```\non {{{{transformers}}}}\n```\n",
    )
    assert run(project, "check", *args) == 0
    out = capsys.readouterr().out
    assert (
        "OK: texts: 1 reproduction(s) in 1 text(s) print what they show (1 run(s): 1 on the pinned fakepkg 1.0" in out
    )
    assert f"== PR {PR1} at its level (fakepkg 1.0 + {PR1}, stock accelerate)" in out
    assert "== PR trainer-logging at its level (fakepkg 1.0 + trainer-loss-scale + trainer-logging, stock acc" in out
    assert "== PR accelerate-skips at its level (fakeacc 1.0 + accelerate-skips, stock transformers)" in out
    # And without its fix (here: its patches outside tests/ undone), each PR's tests fail
    for pr in (PR1, "trainer-logging", "accelerate-skips"):
        assert f"== PR {pr}: its tests fail without its fix (its changes outside tests/ undone), as they must" in out
    # naming the tests that failed, with the first line of the message, never in words a log reader would take for a
    # failure of the run, and quietly: no traceback, captured output or warnings summary
    assert (
        len(re.findall(r"as they must \(\d+ s\): test_\w+ \(AssertionError: .*\)$", out, flags=re.MULTILINE)) == 2
    ), out
    for noise in ("FAILED", "Traceback", "FAILURES", "Captured", "warnings summary", "def test_"):
        assert noise not in out, noise

    # PR1's tests need PR2's change: they fail at PR1's level although they pass on the whole fork
    add_to_stack(project, PR1, tests=["tests/trainer/test_logging.py"])
    assert run(project, "check", *args) == 1
    err = capsys.readouterr().err
    assert f"FAIL: PR {PR1}: its tests failed (pytest exit status 4) at its level, fakepkg 1.0 + {PR1}" in err


def test_level_tests_run_in_a_defined_environment(project, tmp_path, monkeypatch, capsys):
    """`make upgrade ACCELERATE=1.16.0` put ACCELERATE into the environment of the level tests, whose upstream test
    helpers delete every variable named like it, so that the global-state plugin failed them."""
    test = project / "tests/trainer/test_loss_scale.py"
    write(
        test,
        test.read_text(encoding="utf-8") + "\n\ndef test_like_upstreams_helpers():\n"
        "    import os\n\n    for key in [k for k in os.environ if 'ACCELERATE' in k]:\n        del os.environ[key]\n",
    )
    for name, value in (("ACCELERATE", "1.16.0"), ("ACCELERATE_MIXED_PRECISION", "bf16"), ("PYTEST_ADDOPTS", "-x")):
        monkeypatch.setenv(name, value)
    assert run(project, "check", "--venv", str(fake_venv(tmp_path)), "--tests", "--pytest-args=-q") == 0
    assert f"== PR {PR1}: its tests pass at its level" in capsys.readouterr().out


@pytest.mark.parametrize(
    "mutation, problem",
    [
        (["src/transformers/trainer.py", "line 21 logged\n", "line 21\n"], None),
        (
            ["src/transformers/trainer.py", "line 30\n", "line 30 changed\n"],
            "PR trainer-logging: its tests pass without its fix (its mutation), at fakepkg 1.0 + trainer-loss-scale + "
            "trainer-logging, stock accelerate: they must fail there: tests/trainer/test_logging.py",
        ),
        (
            ["src/transformers/trainer.py", "no such line\n", ""],
            "PR trainer-logging: its mutation's text must occur once in src/transformers/trainer.py, found 0 times",
        ),
    ],
)
def test_check_runs_a_prs_tests_with_its_mutation(project, tmp_path, capsys, mutation, problem):
    make_stack(project)
    entries = json.loads((project / "patches/stack.json").read_text(encoding="utf-8"))
    entries[-1]["mutation"] = mutation
    set_stack(project, entries)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    assert run(project, "check", "--venv", str(venv), "--tests", "--pytest-args=-q") == (0 if problem is None else 1)
    out, err = capsys.readouterr()
    if problem is None:
        assert "== PR trainer-logging: its tests fail without its fix (its mutation), as they must" in out
    else:
        assert f"FAIL: {problem}" in err


@pytest.mark.parametrize(
    "problem",
    [
        "missing_patch",
        "unowned_patch",
        "shared_file",
        "order",
        "missing_description",
        "unknown_upstream",
        "dependency",
    ],
)
def test_check_names_the_pr_and_file_of_a_bad_stack(project, tmp_path, capsys, problem):
    patches = make_stack(project)
    entries = json.loads((project / "patches/stack.json").read_text(encoding="utf-8"))
    logging = entries[2]
    if problem == "missing_patch":
        logging["patches"].append("missing.patch")
        expected = "patches/stack.json, PR trainer-logging: patch patches/transformers/missing.patch does not exist"
    elif problem == "unowned_patch":
        logging["patches"] = []
        expected = f"patch patches/transformers/{patches['trainer-logging'].name} belongs to no PR (add it to one)"
    elif problem == "shared_file":
        logging["overlay"].append("src/transformers/loss_scale.py")
        expected = "PR trainer-logging: overlay file src/transformers/loss_scale.py already belongs to PR " + PR1
    elif problem == "order":
        entries[1], entries[2] = entries[2], entries[1]
        entries[1]["depends_on"] = []
        expected = "patches/transformers/.patches orders the transformers patches differently from patches/stack.json"
    elif problem == "dependency":  # its patch needs PR1's change next to it, but it claims to need only accelerate
        logging["depends_on"] = ["accelerate-skips"]
        expected = (
            f"PR trainer-logging: patch patches/transformers/{patches['trainer-logging'].name} does not apply at the "
            "level of PR trainer-logging, fakepkg 1.0 + trainer-logging"
        )
    elif problem == "missing_description":
        logging["description"] = "docs/pr/nope.md"
        expected = "PR trainer-logging: description docs/pr/nope.md does not exist"
    else:
        logging["upstream"] = "tranformers"
        expected = (
            "patches/stack.json, PR trainer-logging: upstream 'tranformers' is not one of transformers, accelerate"
        )
    set_stack(project, entries)
    capsys.readouterr()
    assert run(project, "check") == 1
    assert expected in capsys.readouterr().err
    if problem == "dependency":
        logging["depends_on"] = []
        logging["patches"] = []  # a PR with only new files depends on nothing
        entries[1]["patches"].append(patches["trainer-logging"].name)
        set_stack(project, entries)
        assert run(project, "check") == 0
        return
    out = tmp_path / "dist"
    assert run(project, "pr", "--out", str(out), "--author", "Jane <j@example.invalid>") == 1
    assert expected in capsys.readouterr().err and not out.exists()


def test_level_guard_refuses_a_package_imported_from_outside_the_level(tmp_path):
    from workbench.stack import GUARD_PLUGIN

    (tmp_path / "workbench_level_guard.py").write_text(GUARD_PLUGIN, encoding="utf-8")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WORKBENCH_LEVEL_PACKAGE": "json"}
    cmd = [sys.executable, "-m", "pytest", "-p", "workbench_level_guard", "-p", "no:cacheprovider", "test_x.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, env={**env, "WORKBENCH_LEVEL_SRC": str(tmp_path)}, capture_output=True)
    assert proc.returncode != 0 and b"json was imported from" in proc.stdout + proc.stderr
    json_src = str(Path(json.__file__).parent.parent)
    proc = subprocess.run(cmd, cwd=tmp_path, env={**env, "WORKBENCH_LEVEL_SRC": json_src}, capture_output=True)
    assert proc.returncode == 0, proc.stdout


def test_wrong_accelerate_sdist_hash_is_a_clear_error(project, capsys):
    config = json.loads((project / "patches/config.json").read_text(encoding="utf-8"))
    config["upstreams"]["accelerate"]["sha256"] = "1" * 64
    (project / "patches/config.json").write_text(json.dumps(config), encoding="utf-8")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "sha256 mismatch for the accelerate sdist build/cache/fakeacc-1.0.tar.gz" in err
    assert "upstreams.accelerate.sha256 in patches/config.json" in err
    assert run(project, "check") == 1
    assert "sha256 mismatch for the accelerate sdist" in capsys.readouterr().err


def test_accelerate_fork_has_its_own_overlay_folder(project):
    assert run(project, "build") == 0
    acc = project / "build/accelerate"
    commit_in_fork_at(acc, "Add a test file", {"tests/test_skips.py": "def test_skips():\n    pass\n"})
    assert run(project, "export", "--upstream", "accelerate") == 0
    assert (project / "accelerate/tests/test_skips.py").read_text(encoding="utf-8") == "def test_skips():\n    pass\n"
    assert not (project / "tests/test_skips.py").exists()
    assert list((project / "patches/accelerate").glob("*.patch")) == []


def commit_in_fork_at(fork_path: Path, message: str, edits: dict[str, str]) -> None:
    for rel, text in edits.items():
        write(fork_path / rel, text)
    sh(fork_path, "git", "add", "-A")
    sh(fork_path, "git", *USER, "commit", "-q", "-m", message)


def test_build_on_an_existing_clone_makes_a_branch_per_pr(project, tmp_path, capsys):
    make_stack(project)
    clone = pristine_checkout(tmp_path, project / "build/cache/fakepkg-1.0.tar.gz", "clone")
    sh(clone, "git", "config", "user.name", "Clone Dev")
    sh(clone, "git", "config", "user.email", "clone@example.invalid")
    assert run(project, "build", "--clone", str(clone), "--pr", PR1) == 0
    assert sh(clone, "git", "branch", "--show-current").strip() == "main"  # the clone's checkout stays
    assert sh(clone, "git", "rev-list", "--count", f"main..{PR1}").strip() == "2"
    assert "line 20 patched" in sh(clone, "git", "show", f"{PR1}:src/transformers/trainer.py")
    assert "line 21 logged" not in sh(clone, "git", "show", f"{PR1}:src/transformers/trainer.py")
    assert set(sh(clone, "git", "log", "--format=%an <%ae>", f"main..{PR1}").split("\n")) == {
        "Clone Dev <clone@example.invalid>",
        "",
    }
    assert run(project, "build", "--clone", str(clone), "--pr", PR1) == 2  # the branch exists now
    assert "branch trainer-loss-scale exists" in capsys.readouterr().err
    sh(clone, "git", "checkout", "-q", "main")
    assert run(project, "build", "--clone", str(clone)) == 0  # default: the whole transformers stack
    assert sh(clone, "git", "rev-list", "--count", "main..trainer-logging").strip() == "4"


def test_pr_writes_the_issue_drafts_and_tells_the_submitter_how_it_was_made(project, tmp_path, capsys):
    write_text(project / "docs/issues/transformers-loss-scale.md", "# Proposal: log the loss scale\n\nWhy.\n")
    write_text(project / "docs/pr/tests-gc-freeze-after-collection.md", description("Freezes."))
    entries = json.loads((project / "patches/stack.json").read_text(encoding="utf-8"))
    entries[0]["issue_first"] = "docs/issues/transformers-loss-scale.md"
    set_stack(project, entries)
    out = tmp_path / "dist"
    capsys.readouterr()
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 0
    printed = capsys.readouterr().out
    assert (out / "issues/transformers-loss-scale.md").read_text(encoding="utf-8").startswith("# Proposal")
    assert (out / "outside-the-stack/tests-gc-freeze-after-collection.md").is_file()
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# Before you open anything") and "Code Agent Policy" in readme
    assert (
        "automated tooling" in readme
        and "in your own words" in readme
        and "clone of upstream's current main" in readme
    )
    assert f"## 01-{PR1}" in readme and "**open the issue first**: `issues/transformers-loss-scale.md`" in readme
    # The base each series was made on, and the step before opening it: `make open` on a clone of main, GPU check
    assert (
        f"- made on: fakepkg 1.0, the pinned release's sdist (pristine); before opening: `make open "
        f"CLONE=../transformers PR={PR1}` on your clone of main" in readme
    )
    assert "`make open CLONE=<your clone> PR=<name>`" in readme and "`bench/gpu_check.py`" in readme
    assert "open the issue first**: `issues/transformers-gc-freeze-after-collection.md`" in readme
    assert (
        "after the issue transformers-loss-scale.md" in printed and "docs/issues/transformers-loss-scale.md" in printed
    )

    # A text that breaks a rule: nothing is written
    write(project / "docs/issues/transformers-loss-scale.md", "# Proposal\n\nAs our workbench found.\n")
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 1
    assert "says 'workbench'" in capsys.readouterr().err
    assert "Why." in (out / "issues/transformers-loss-scale.md").read_text(encoding="utf-8")


def test_pr_writes_a_staged_plan_each_step_with_what_it_waits_for(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    monkeypatch.setitem(
        texts.COMMENTS, "accelerate-9-comment", Comment("huggingface/accelerate#9", "asks", "accelerate-skips")
    )
    review = Comment("huggingface/accelerate#10", "suggests", "accelerate-skips", "a maintainer preferring a PR")
    monkeypatch.setitem(texts.COMMENTS, "accelerate-10-review", review)
    entries = json.loads((project / "patches/stack.json").read_text(encoding="utf-8"))
    entries[2]["issue_first"] = "docs/issues/transformers-loss-scale.md"
    entries[2]["belongs_in"] = "tests/trainer/test_trainer.py"
    set_stack(project, entries)
    write_text(project / "docs/issues/transformers-loss-scale.md", "# Proposal: log the loss scale\n\nWhy.\n")
    write_text(project / "docs/issues/transformers-finding.md", "# A finding\n\nWhat.\n")
    write_text(project / "docs/issues/transformers-gc-freeze-after-collection.md", "# RFC: gc.freeze\n\nWhy.\n")
    write_text(project / "docs/pr/tests-gc-freeze-after-collection.md", description("Freezes."))
    write_text(project / "docs/pr/accelerate-4291-review-note.md", "# Review cases\n\nCases.\n")
    write_text(project / "docs/issues/transformers-duplicate.md", "# Reported elsewhere\n\nWhat.\n")
    monkeypatch.setitem(texts.LEFT_OUT, "docs/issues/transformers-duplicate.md", "reported in accelerate#9")
    monkeypatch.setitem(
        texts.OUTSIDE_STACK,
        "tests-gc-freeze-after-collection",
        Outside("transformers", "a PR for tests", "transformers-gc-freeze-after-collection.md"),
    )
    monkeypatch.setitem(
        texts.OUTSIDE_STACK,
        "accelerate-4291-review-note",
        Outside(None, "review cases"),
    )
    monkeypatch.setitem(texts.LEFT_OUT, "docs/pr/accelerate-4291-review-note.md", "accelerate#4291's tests cover them")
    out = tmp_path / "dist"
    author = ["--author", "Jane Doe <jane@example.invalid>"]
    # The accelerate PR waits for the comment: its draft must exist
    capsys.readouterr()
    assert run(project, "check") == 1
    assert "docs/issues/accelerate-9-comment.md does not exist: PR accelerate-skips waits for this comment on " in (
        capsys.readouterr().err
    )
    write_text(project / "docs/issues/accelerate-9-comment.md", "Proposal: read the flag.\n")
    write_text(project / "docs/issues/accelerate-10-review.md", "Suggestion: read the flag.\n")
    assert run(project, "pr", "--out", str(out), *author) == 0
    readme = (out / "README.md").read_text(encoding="utf-8")
    plan = readme[readme.index("# The plan") : readme.index("# The PR stack")]
    assert plan.splitlines()[2:] == [
        "1. Post `issues/accelerate-9-comment.md` as a comment on huggingface/accelerate#9: it asks. Waits for nothing.",
        "2. Post `issues/accelerate-10-review.md` as a comment on huggingface/accelerate#10: it suggests. Waits for "
        "nothing.",
        "3. Open `01-accelerate-skips` (accelerate) once `make open CLONE=../accelerate PR=accelerate-skips` says it "
        "is ready to push. Waits for an answer to the comment on huggingface/accelerate#9 "
        "(`issues/accelerate-9-comment.md`); a maintainer preferring a PR (`issues/accelerate-10-review.md`).",
        f"4. Open `02-{PR1}` (transformers) once `make open CLONE=../transformers PR={PR1}` says it is ready to "
        "push. Waits for nothing.",
        "5. Open `03-trainer-logging` (transformers) once `make open CLONE=../transformers PR=trainer-logging` says "
        "it is ready to push. Waits for an answer to the issue "
        f"`issues/transformers-loss-scale.md` (open it first); 02-{PR1} merged (this PR applies on top of it); "
        "01-accelerate-skips merged (this PR applies on top of it).",
        "",
        "Not in this plan: after the PRs above are merged, one at a time:",
        "",
        "- Open the issue `issues/transformers-finding.md`.",
        "- Open the issue `issues/transformers-gc-freeze-after-collection.md`.",
        "- Open `outside-the-stack/tests-gc-freeze-after-collection.md` (a PR for tests). Waits for an answer to the "
        "issue `issues/transformers-gc-freeze-after-collection.md`.",
        "",
        "Not in dist/: `docs/issues/transformers-duplicate.md` (an issue draft): reported in accelerate#9.",
        "Not in dist/: `docs/pr/accelerate-4291-review-note.md` (review cases): accelerate#4291's tests cover them.",
        "",
    ]
    assert "- `issues/accelerate-9-comment.md` (a comment on huggingface/accelerate#9, not a new issue)" in readme
    assert "- where its tests belong upstream: `tests/trainer/test_trainer.py`" in readme
    assert (out / "issues/accelerate-9-comment.md").is_file()
    assert (out / "outside-the-stack/tests-gc-freeze-after-collection.md").is_file()
    assert not (out / "outside-the-stack/accelerate-4291-review-note.md").exists()
    assert not (out / "issues/transformers-duplicate.md").exists()


def test_a_pr_waits_for_the_previous_one_of_its_upstream_to_be_reviewed(project):
    prs = [
        PR("accelerate-a", "accelerate", "A", 1),
        PR("transformers-b", "transformers", "B", 2),
        PR("transformers-c", "transformers", "C", 3),
        PR("transformers-d", "transformers", "D", 4, depends_on=["transformers-c"]),
    ]
    project_ = load_project(project)
    assert [waits_for(project_, prs, pr) for pr in prs] == [
        [],
        [],
        ["`02-transformers-b` reviewed by a maintainer (one of these PRs open at a time)"],
        ["03-transformers-c merged (this PR applies on top of it)"],
    ]


def test_a_prs_edit_of_an_upstream_test_file_ships_beside_its_series(project, tmp_path, capsys):
    make_stack(project)
    entries = json.loads((project / "patches/stack.json").read_text(encoding="utf-8"))
    entries[2]["upstream_test_patch"] = "patches/transformers-tests/test_logging_edit.patch"
    set_stack(project, entries)
    capsys.readouterr()
    assert run(project, "check") == 1
    assert (
        "patches/stack.json, PR trainer-logging: upstream_test_patch patches/transformers-tests/test_logging_edit.patch "
        "does not exist" in capsys.readouterr().err
    )
    diff = "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-old\n+new\n"
    header = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Fixed Identity\n <fixed@example.invalid>\nDate: Wed, 2 Dec 2026 00:00:00 +0000\nSubject: Edit the test\n\n---\n"
    write(project / "patches/transformers-tests/test_logging_edit.patch", header + diff)
    assert run(project, "check") == 0
    out = tmp_path / "dist"
    assert run(project, "pr", "--out", str(out), "--author", "Jane Doe <jane@example.invalid>") == 0
    shipped = "03-trainer-logging/upstream-test/test_logging_edit.patch"
    # Authored by the contributor, like the series
    assert (out / shipped).read_text(encoding="utf-8") == (header + diff).replace(
        "From: Fixed Identity\n <fixed@example.invalid>", "From: Jane Doe <jane@example.invalid>"
    )
    assert "test_logging_edit" not in " ".join(p.name for p in (out / "03-trainer-logging").glob("*.patch"))
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert f"`git am {shipped}`, one more commit of this PR" in readme
    assert "In your clone of upstream main, on the same branch, after the series" in readme


# --------------------------------------------------------------------------------------------------------------
# Following upstream: the pin file, the traps of a new release, `upgrade`. The "package index" is a folder of sdists
# that pip reads (PIP_NO_INDEX, PIP_FIND_LINKS): no network. Each sdist builds its metadata with a backend of its own.

BACKEND = (
    "import os\n\n\ndef prepare_metadata_for_build_wheel(directory, config_settings=None):\n"
    "    info = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'METADATA')).read()\n"
    "    name = '{0}-{1}.dist-info'\n    os.makedirs(os.path.join(directory, name))\n"
    "    open(os.path.join(directory, name, 'METADATA'), 'w').write(info)\n    return name\n"
)
BACKEND_PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "fake_backend"\nbackend-path = ["."]\n'


def index_sdist(index: Path, package: str, version: str, files: dict[str, str], pkg_info_version: str = "") -> str:
    """Put ``<package>-<version>.tar.gz`` (``files`` plus what pip needs) into the folder ``index``; its sha256. Its
    ``PKG-INFO`` says ``pkg_info_version`` (default: ``version``), pip's metadata says ``version``."""
    metadata = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
    extra = {
        "pyproject.toml": BACKEND_PYPROJECT,
        "fake_backend.py": BACKEND.format(package, version),
        "METADATA": metadata,
        "PKG-INFO": metadata.replace(f"Version: {version}", f"Version: {pkg_info_version or version}"),
    }
    index.mkdir(parents=True, exist_ok=True)
    return make_sdist(index / f"{package}-{version}.tar.gz", {**files, **extra}, f"{package}-{version}")


def use_index(monkeypatch, index: Path) -> None:
    """pip reads the folder ``index`` as its only package index."""
    index.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))


def set_pin(root: Path, name: str, **values) -> None:
    config = json.loads((root / "patches/config.json").read_text(encoding="utf-8"))
    config["upstreams"][name].update(values)
    (root / "patches/config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def test_the_pin_file_holds_each_release_once(project):
    config = json.loads((project / "patches/config.json").read_text(encoding="utf-8"))
    assert "sdist" not in config["upstreams"]["transformers"]
    assert load_project(project).upstreams["accelerate"].sdist_name == "fakeacc-1.0.tar.gz"
    mine = json.loads((REPO_ROOT / "patches/config.json").read_text(encoding="utf-8"))
    assert all(set(entry) >= {"version", "sha256"} and "sdist" not in entry for entry in mine["upstreams"].values())


def test_trap_a_an_sdist_of_another_version_is_refused(project, capsys):
    # Only the version changed in the pin file, and the cache holds the old release under the new name
    cache = project / "build/cache"
    (cache / "fakepkg-1.0.tar.gz").rename(cache / "fakepkg-1.1.tar.gz")
    set_pin(project, "transformers", version="1.1")
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert "fakepkg-1.1.tar.gz holds fakepkg 1.0, not the pinned 1.1" in err
    assert not fork_dir(project).exists() and not list(project.glob("build/.transformers.*"))
    assert run(project, "check") == 1
    assert "holds fakepkg 1.0, not the pinned 1.1" in capsys.readouterr().err


def test_trap_b_a_stale_pin_right_after_a_download_prints_the_real_hash(project, tmp_path, monkeypatch, capsys):
    (project / "build/cache/fakepkg-1.0.tar.gz").unlink()
    real = index_sdist(tmp_path / "index", "fakepkg", "1.0", UPSTREAM_FILES)
    use_index(monkeypatch, tmp_path / "index")
    set_pin(project, "transformers", sha256="0" * 64)
    assert run(project, "build") == 1
    err = capsys.readouterr().err
    assert f"got      {real}" in err
    assert (
        f"the pin file is stale. If that release is the one you want, put {real} as upstreams.transformers.sha256"
        in err
    )
    assert "Delete" not in err  # downloading again would change nothing
    assert not (project / "build/cache/fakepkg-1.0.tar.gz").exists() and not fork_dir(project).exists()
    set_pin(project, "transformers", sha256=real)  # what the message says to do
    assert run(project, "build") == 0


def test_trap_c_build_leaves_the_stock_sources_of_the_pinned_releases(project):
    assert run(project, "build") == 0
    stock = project / "build/stock/src"
    assert (stock / "transformers/__init__.py").read_text(encoding="utf-8") == "__version__ = '1.0'\n"
    assert (stock / "fakeacc/optimizer.py").read_text(encoding="utf-8") == OPTIMIZER
    files = {**UPSTREAM_FILES, "PKG-INFO": "Name: fakepkg\nVersion: 1.1\n"}
    files["src/transformers/__init__.py"] = "__version__ = '1.1'\n"
    sha = make_sdist(project / "build/cache/fakepkg-1.1.tar.gz", files, "fakepkg-1.1")
    set_pin(project, "transformers", version="1.1", sha256=sha)
    assert run(project, "build") == 0
    assert (stock / "transformers/__init__.py").read_text(encoding="utf-8") == "__version__ = '1.1'\n"


def test_trap_d_an_editable_install_of_another_version_is_refreshed(project, tmp_path, monkeypatch):
    from workbench import forks

    assert run(project, "build") == 0
    site = tmp_path / "site-packages"  # what `pip install -e build/transformers` left, at version 1.0
    info = site / "fakepkg-1.0.dist-info"
    write(info / "METADATA", "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    url = {"url": fork_dir(project).resolve().as_uri(), "dir_info": {"editable": True}}
    write(info / "direct_url.json", json.dumps(url))
    monkeypatch.setenv("PYTHONPATH", str(site))
    installs = []
    monkeypatch.setattr(forks, "pip_install", lambda project, *args: installs.append(args[-2:]))
    fake = load_project(project, venv=fake_venv(tmp_path))
    forks.install_forks(fake, [fake.upstreams["transformers"]])
    assert installs == []  # editable from the fork, at the pinned version: nothing to do
    fake.upstreams["transformers"].version = "1.1"  # a new release: pip must install it (and check its requirements)
    forks.install_forks(fake, [fake.upstreams["transformers"]])
    assert installs == [("-e", str(fork_dir(project)))]


def test_check_names_each_requirement_of_the_releases_the_venv_lacks_and_asks_the_index(
    project, tmp_path, monkeypatch
):
    from workbench import forks

    assert run(project, "build") == 0
    pkg_info = (
        "Name: fakepkg\nVersion: 1.0\nRequires-Dist: pytest>=1\nRequires-Dist: Kernels_X<0.20,>=0.19.1\n"
        "Requires-Dist: absent-y<2\nRequires-Dist: absent-z; python_version < '3'\n"
        'Requires-Dist: absent-extra; extra == "testing"\n'
    )
    write(fork_dir(project) / "PKG-INFO", pkg_info)
    asked = []
    # The index has kernels-x, not absent-y (the query itself: test_index_has_asks_pip_download)
    monkeypatch.setattr(forks, "index_has", lambda project, r: asked.append(r) or r.startswith("Kernels_X"))
    fake = load_project(project, venv=fake_venv(tmp_path))
    venv = fake.rel(fake.venv)
    assert forks.requirement_problems(fake) == [
        f"fakepkg 1.0 requires Kernels_X<0.20,>=0.19.1, which {venv} does not have: the package index has it "
        "(`make fork` installs it)",
        f"fakepkg 1.0 requires absent-y<2, which {venv} does not have: the package index has no release that "
        "satisfies it (pip download --no-deps found none)",
    ]  # pytest is installed; a marker that is false and an extra are not required
    assert asked == ["Kernels_X<0.20,>=0.19.1", "absent-y<2"]  # the index is asked only about what is missing
    write(fork_dir(project) / "PKG-INFO", "Name: fakepkg\nVersion: 1.0\nRequires-Dist: pytest>=1\n")
    asked.clear()
    assert forks.requirement_problems(fake) == [] and asked == []


def test_index_has_asks_pip_download(project, tmp_path, monkeypatch):
    from workbench import forks

    index = tmp_path / "index"
    index_sdist(index, "fakekernels", "0.19.1", {"fakekernels.py": ""})
    use_index(monkeypatch, index)
    fake = load_project(project, venv=fake_venv(tmp_path))
    assert forks.index_has(fake, "fakekernels<0.20,>=0.19.1")
    assert not forks.index_has(fake, "fakekernels>=0.20")
    assert not forks.index_has(fake, "absent-y")


def test_check_fails_on_a_requirement_the_venv_lacks(project, tmp_path, monkeypatch, capsys):
    from workbench import cli

    monkeypatch.setattr(cli, "requirement_problems", lambda project: ["fakepkg 1.0 requires kernels-x, which ..."])
    monkeypatch.setattr(cli, "check_upstream", lambda *args: [])  # the levels and their tests: other tests
    monkeypatch.setattr(cli, "verify_texts", lambda *args: ([], None))
    assert run(project, "check", "--venv", str(fake_venv(tmp_path)), "--tests") == 1
    assert "FAIL: fakepkg 1.0 requires kernels-x, which ..." in capsys.readouterr().err
    assert run(project, "check") == 0  # without --tests no venv is needed, and none is asked


def new_release(index: Path, trainer: str = TRAINER, optimizer: str = OPTIMIZER) -> dict[str, str]:
    """fakepkg 1.1 and fakeacc 1.1 on the index; their sha256 by upstream."""
    files = {**UPSTREAM_FILES, "src/transformers/trainer.py": trainer}
    files["src/transformers/__init__.py"] = "__version__ = '1.1'\n"
    return {
        "transformers": index_sdist(index, "fakepkg", "1.1", files),
        "accelerate": index_sdist(
            index, "fakeacc", "1.1", {**ACCELERATE_FILES, "src/fakeacc/optimizer.py": optimizer}
        ),
    }


def upgrade(root: Path, tmp_path: Path, *args: str) -> int:
    return run(root, "upgrade", "--no-install", "--venv", str(fake_venv(tmp_path)), "--pytest-args=-q", *args)


def test_upgrade_moves_the_stack_to_the_new_releases(project, tmp_path, monkeypatch, capsys):
    patches = make_stack(project)
    before = {name: path.read_bytes() for name, path in patches.items()}
    use_index(monkeypatch, tmp_path / "index")
    hashes = new_release(tmp_path / "index", trainer="new 1\nnew 2\nnew 3\n" + TRAINER)  # the patches move by 3
    capsys.readouterr()
    assert upgrade(project, tmp_path) == 0
    out = capsys.readouterr().out
    for number, what in enumerate(["Finding", "Downloading", "Building", "Writing", "Installing", "Running"], 1):
        assert f"\n[{number}/6] {what}" in out
    assert "transformers: 1.0 -> 1.1" in out and "accelerate: 1.0 -> 1.1" in out
    config = json.loads((project / "patches/config.json").read_text(encoding="utf-8"))
    for name, sha in hashes.items():
        assert config["upstreams"][name]["version"] == "1.1" and config["upstreams"][name]["sha256"] == sha
    # Re-exported: the transformers patches moved (index lines and offsets), the accelerate patch did not change
    from workbench.series import moved_only

    for name in (PR1, "trainer-logging"):
        after = patches[name].read_bytes()
        assert after != before[name] and moved_only(before[name], after)
    assert patches["accelerate-skips"].read_bytes() == before["accelerate-skips"]
    for pr in (PR1, "trainer-logging", "accelerate-skips"):
        assert re.search(rf"^{pr} +applies +pass +fail \(as they must\)$", out, flags=re.MULTILINE), out
    assert "The stack is ready." in out
    assert (project / "build/stock/src/transformers/__init__.py").read_text(
        encoding="utf-8"
    ) == "__version__ = '1.1'\n"
    assert run(project, "build") == 0 and "is up to date" in capsys.readouterr().out
    assert run(project, "check") == 0


def test_upgrade_leaves_a_conflict_ready_to_edit(project, tmp_path, monkeypatch, capsys):
    patches = make_stack(project)
    use_index(monkeypatch, tmp_path / "index")
    new_release(tmp_path / "index", trainer=TRAINER.replace("line 20\n", "line 20 upstream\n"))
    capsys.readouterr()
    assert upgrade(project, tmp_path) == 1
    out = capsys.readouterr().out
    conflict = f"CONFLICT in {patches[PR1].name}: src/transformers/trainer.py (1 hunk)"
    assert re.search(rf"^{PR1} +{re.escape(conflict)} +- +-$", out, flags=re.MULTILINE), out
    assert re.search(r"^trainer-logging +not tried", out, flags=re.MULTILINE)
    assert re.search(r"^accelerate-skips +applies +pass +fail \(as they must\)$", out, flags=re.MULTILINE)
    assert "git add <files> && git am --continue" in out and "The stack is NOT ready" in out
    assert (fork_dir(project) / ".git/rebase-apply").is_dir()
    assert "<<<<<<< " in (fork_dir(project) / "src/transformers/trainer.py").read_text(encoding="utf-8")
    # The new bases were built: the pin file names them, so that `make patches` exports the resolved fork
    assert (
        json.loads((project / "patches/config.json").read_text(encoding="utf-8"))["upstreams"]["transformers"][
            "version"
        ]
        == "1.1"
    )
    # but the stock sources (and the venv) stay on the releases the forks were built on, and the way back is printed
    stock = project / "build/stock/src/transformers/__init__.py"
    assert stock.read_text(encoding="utf-8") == "__version__ = '1.0'\n"
    assert "skipped while a PR conflicts: the venv and build/stock/src stay on fakepkg 1.0, fakeacc 1.0" in out
    back = "Or go back to fakepkg 1.0 and fakeacc 1.0 (the venv and build/stock/src are still on them):\n"
    back += "  git checkout -- patches/config.json patches/transformers patches/accelerate\n"
    back += "  make fork FORK_ARGS=--force"
    assert back in out
    sh(project, "git", "checkout", "--", "patches/config.json", "patches/transformers", "patches/accelerate")
    assert run(project, "build", "--force") == 0
    assert sh(project, "git", "status", "--porcelain") == ""
    assert not (fork_dir(project) / ".git/rebase-apply").exists()
    assert "line 20 patched" in (fork_dir(project) / "src/transformers/trainer.py").read_text(encoding="utf-8")
    assert run(project, "check") == 0


def test_upgrade_reports_a_pr_possibly_fixed_upstream(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    use_index(monkeypatch, tmp_path / "index")
    # Upstream's optimizer now skips too (elsewhere than the PR's change): the PR's test passes without its fix
    new_release(tmp_path / "index", optimizer=OPTIMIZER.replace("step 30\n", "step 30 skipped\n"))
    capsys.readouterr()
    assert upgrade(project, tmp_path) == 1
    out = capsys.readouterr().out
    row = "applies +pass +PASS: possibly fixed upstream; changed under it: src/fakeacc/optimizer.py"
    assert re.search(rf"^accelerate-skips +{row}$", out, flags=re.MULTILINE), out
    assert re.search(rf"^{PR1} +applies +pass +fail \(as they must\)$", out, flags=re.MULTILINE)


@pytest.mark.parametrize("failure", ["unreachable", "missing_release", "wrong_version_inside"])
def test_upgrade_that_fails_changes_nothing(project, tmp_path, monkeypatch, capsys, failure):
    make_stack(project)
    config = (project / "patches/config.json").read_bytes()
    head = sh(fork_dir(project), "git", "rev-parse", "HEAD")
    use_index(monkeypatch, tmp_path / "index")
    args = []
    if failure == "missing_release":
        new_release(tmp_path / "index")
        args = ["--transformers", "9.9"]
        expected = "fakepkg 9.9 is not a release on the package index (newest: 1.1); nothing was changed"
    elif failure == "wrong_version_inside":  # the index serves 1.1, whose own PKG-INFO says 1.0
        new_release(tmp_path / "index")
        index_sdist(tmp_path / "index", "fakepkg", "1.1", UPSTREAM_FILES, pkg_info_version="1.0")
        expected = "fakepkg-1.1.tar.gz holds fakepkg 1.0, not the pinned 1.1"
    else:
        expected = "could not read the releases of fakepkg from the package index (is it reachable?)"
    capsys.readouterr()
    assert upgrade(project, tmp_path, *args) == (2 if failure == "missing_release" else 1)  # bad input: 2
    assert expected in capsys.readouterr().err
    assert (project / "patches/config.json").read_bytes() == config
    assert sh(fork_dir(project), "git", "rev-parse", "HEAD") == head
    assert sh(project, "git", "status", "--porcelain") == ""
    assert not list(project.glob("build/.*upgrade*"))


def test_upgrade_to_an_older_release_needs_allow_older(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    config = (project / "patches/config.json").read_bytes()
    use_index(monkeypatch, tmp_path / "index")
    files = {**UPSTREAM_FILES, "src/transformers/__init__.py": "__version__ = '0.9'\n"}
    index_sdist(tmp_path / "index", "fakepkg", "0.9", files)
    index_sdist(tmp_path / "index", "fakeacc", "1.1", ACCELERATE_FILES)
    capsys.readouterr()
    assert upgrade(project, tmp_path, "--transformers", "0.9") == 2
    assert "fakepkg 0.9 is older than the pinned 1.0: moving back needs --allow-older" in capsys.readouterr().err
    assert (project / "patches/config.json").read_bytes() == config
    assert sh(project, "git", "status", "--porcelain") == ""
    assert upgrade(project, tmp_path, "--transformers", "0.9", "--allow-older") == 0
    assert "transformers: 1.0 -> 0.9" in capsys.readouterr().out
    assert (
        json.loads((project / "patches/config.json").read_text(encoding="utf-8"))["upstreams"]["transformers"][
            "version"
        ]
        == "0.9"
    )


def test_upgrade_when_already_up_to_date_says_so_and_stops(project, tmp_path, monkeypatch, capsys):
    use_index(monkeypatch, tmp_path / "index")
    for name, package, files in (
        ("transformers", "fakepkg", UPSTREAM_FILES),
        ("accelerate", "fakeacc", ACCELERATE_FILES),
    ):
        set_pin(project, name, sha256=index_sdist(tmp_path / "index", package, "1.0", files))  # the pinned releases
        (project / f"build/cache/{package}-1.0.tar.gz").write_bytes(
            (tmp_path / f"index/{package}-1.0.tar.gz").read_bytes()
        )
    sh(project, "git", *USER, "commit", "-q", "-am", "the releases on the index")
    make_stack(project)
    config = (project / "patches/config.json").read_bytes()
    head = sh(fork_dir(project), "git", "rev-parse", "HEAD")
    capsys.readouterr()
    assert upgrade(project, tmp_path) == 0
    out = capsys.readouterr().out
    assert (
        "Already up to date: the pins are fakepkg 1.0 and fakeacc 1.0 (the newest on the package index); nothing was "
        "changed (--force rebuilds and retests)." in out
    )
    assert "[2/6]" not in out
    assert upgrade(project, tmp_path, "--transformers", "1.0") == 0
    assert "Already up to date: the pins are fakepkg 1.0 and fakeacc 1.0; nothing" in capsys.readouterr().out
    assert (project / "patches/config.json").read_bytes() == config
    assert sh(fork_dir(project), "git", "rev-parse", "HEAD") == head
    assert upgrade(project, tmp_path, "--force") == 0
    out = capsys.readouterr().out
    assert "[2/6] Downloading" in out and "The stack is ready." in out


def test_upgrade_refuses_to_overwrite_uncommitted_pins_or_patches(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    use_index(monkeypatch, tmp_path / "index")
    new_release(tmp_path / "index")
    config = (project / "patches/config.json").read_bytes() + b"\n"  # an edit of one's own, not committed
    (project / "patches/config.json").write_bytes(config)
    capsys.readouterr()
    assert upgrade(project, tmp_path) == 1
    err = capsys.readouterr().err
    assert "upgrade rewrites these, which have uncommitted changes: patches/config.json" in err
    assert (project / "patches/config.json").read_bytes() == config


def test_changing_a_prs_commit_as_the_readme_says_rewrites_its_patch(project, capsys):
    """A plain commit in the fork becomes a new patch of no PR; the README's
    commands fold the change into the PR's own commit."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("To change a PR's existing commit") :]
    block = block[block.index("```bash\n") + 8 : block.index("```\n", block.index("```bash\n") + 8)]
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("git ")]
    assert commands == [
        "git add src/transformers/trainer.py",
        'git commit --fixup=":/Trainer: resume fp16 checkpoints without a matching loss scaler"',
        "git -c sequence.editor=: rebase -i --autosquash workbench-overlay",
    ]
    patches = make_stack(project)
    before = {name: path.read_bytes() for name, path in patches.items()}
    fork = fork_dir(project)
    trainer = (fork / "src/transformers/trainer.py").read_text(encoding="utf-8")
    write(fork / "src/transformers/trainer.py", trainer.replace("line 5\n", "line 5 patched\n"))
    identity = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.invalid"}
    identity.update(GIT_COMMITTER_NAME="Dev", GIT_COMMITTER_EMAIL="dev@example.invalid")
    for command in commands:  # PR1's commit is "Patch the trainer" here
        command = command.replace(
            "Trainer: resume fp16 checkpoints without a matching loss scaler", "Patch the trainer"
        )
        proc = subprocess.run(
            command, shell=True, cwd=fork, capture_output=True, text=True, env={**os.environ, **identity}
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    capsys.readouterr()
    assert run(project, "export") == 0
    out = capsys.readouterr().out
    assert "belongs to no PR" not in out and "note:" not in out
    assert sorted(p.name for p in (project / "patches/transformers").glob("*.patch")) == sorted(
        p.name for name, p in patches.items() if name != "accelerate-skips"
    )
    assert "+line 5 patched" in patches[PR1].read_text(encoding="utf-8")
    # The later PR's patch of the same file: at most its `index` lines and line numbers move
    from workbench.series import moved_only

    assert moved_only(before["trainer-logging"], patches["trainer-logging"].read_bytes())
    assert run(project, "check") == 0

    # A plain commit instead: export names the new patch as belonging to no PR, and says how to fold it in
    trainer = (fork / "src/transformers/trainer.py").read_text(encoding="utf-8")
    commit_in_fork(project, "More", {"src/transformers/trainer.py": trainer.replace("line 22\n", "line 22 more\n")})
    assert run(project, "export") == 0
    out = capsys.readouterr().out
    assert "belongs to no PR" in out
    assert 'git commit --fixup=":/<its subject>", then git -c sequence.editor=: rebase -i --autosquash' in out


def test_a_commit_after_the_last_patch_leaves_its_file_as_it_was(project):
    """Every exported patch ends as format-patch separates them (with a blank line), the last one too."""
    patches = make_stack(project)
    before = {path.name: path.read_bytes() for path in (project / "patches/transformers").glob("*.patch")}
    fork = fork_dir(project)
    trainer = (fork / "src/transformers/trainer.py").read_text(encoding="utf-8")
    commit_in_fork(project, "More", {"src/transformers/trainer.py": trainer.replace("line 22\n", "line 22 more\n")})
    assert run(project, "export") == 0
    after = {path.name: path.read_bytes() for path in (project / "patches/transformers").glob("*.patch")}
    assert len(after) == len(before) + 1 and patches
    for name, content in before.items():
        assert after[name] == content, name
    assert all(content.endswith(b"\n\n") for content in after.values())


# Ctrl-C: one line saying what was left and how to go on, status 130, no traceback; the advice works.
def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("where", "args", "left"),
    [
        (  # the command to run again is the one that was interrupted: its releases and options
            "download",
            ("--transformers", "1.1", "--allow-older"),
            "nothing was changed; run `make upgrade TRANSFORMERS=1.1 UPGRADE_ARGS='--allow-older --no-install'` again.",
        ),
        (
            "write_stamp",  # stage 3, after the forks were moved onto the new bases
            (),
            "the pins and patches are unchanged; build/transformers, build/accelerate half-moved: `make fork "
            "FORK_ARGS=--force` puts them back on the pins, or run `make upgrade UPGRADE_ARGS='--no-install'` again.",
        ),
        (
            "export_fork",  # stage 4, after the pin file was written
            (),
            "patches/config.json changed: finish with `make check` (it installs the forks and runs each PR's tests), "
            "or go back with `git checkout -- patches/config.json patches/transformers patches/accelerate && make "
            "fork FORK_ARGS=--force`.",
        ),
    ],
)
def test_ctrl_c_in_upgrade_says_what_was_left_and_how_to_go_on(
    project, tmp_path, monkeypatch, capsys, where, args, left
):
    from workbench import upgrade as upgrade_module

    make_stack(project)
    use_index(monkeypatch, tmp_path / "index")
    new_release(tmp_path / "index", trainer="new 1\n" + TRAINER)
    monkeypatch.setattr(upgrade_module, where, interrupt)
    capsys.readouterr()
    assert upgrade(project, tmp_path, *args) == 130
    assert capsys.readouterr().err == f"\nfork.py upgrade: interrupted: {left}\n"
    assert not list(project.glob("build/.*upgrade*"))  # its temporary folders are gone
    if "git checkout" in left:
        sh(project, "git", "checkout", "--", "patches/config.json", "patches/transformers", "patches/accelerate")
    if "FORK_ARGS=--force" in left:
        assert run(project, "build", "--force") == 0
    assert sh(project, "git", "status", "--porcelain") == ""
    assert run(project, "check") == 0


def test_ctrl_c_in_check_changes_nothing(project, tmp_path, monkeypatch, capsys):
    make_stack(project)
    monkeypatch.setattr(fork, "build_levels", interrupt)
    monkeypatch.setattr(fork.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    capsys.readouterr()
    assert run(project, "check") == 130
    assert capsys.readouterr().err == (
        "\nfork.py check: interrupted: nothing was changed (the levels were built in a temporary folder); run `make "
        "check` again.\n"
    )
    assert list((tmp_path / "tmp").iterdir()) == []
    assert sh(project, "git", "status", "--porcelain") == ""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the processes' states in /proc (Linux)")
def test_ctrl_c_stops_a_test_run_quietly_its_workers_included(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) while a level's pytest runs: pytest-xdist printed a traceback
    when it landed as the workers stopped. The test run is in a session of its own, which SIGINT does not reach: the
    check stops it and its workers (one that outlives SIGTERM is killed), and only the check's one line is printed."""
    pids = tmp_path / "pids"
    check = (  # stands for `make check`: the level's tests through run_tests, the command's Ctrl-C line
        f"import sys; sys.path.insert(0, {str(REPO_ROOT / 'utils')!r})\n"
        "from workbench.testenv import run_tests\n"
        f"try:\n    run_tests([sys.executable, '-c', {fake_test_run(pids)!r}])\n"
        "except KeyboardInterrupt:\n    print('interrupted'); sys.exit(130)\n"
    )
    assert ctrl_c(check, pids) == (130, "interrupted\n")
    assert not [pid for pid in map(int, pids.read_text(encoding="utf-8").split()) if running(pid)]


def fake_test_run(pids: Path, on_ctrl_c: str = "pass") -> str:
    """A script standing for a test run: it starts a worker that handles SIGTERM (as torchrun does), writes both pids
    to ``pids``, and on Ctrl-C runs ``on_ctrl_c`` and prints a traceback's first line."""
    worker = (
        "import os, signal, time; signal.signal(signal.SIGTERM, lambda *args: None)\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    )
    return (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {worker!r}])\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        f"try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    {on_ctrl_c}; print('Traceback (Ctrl-C)')\n"
    )


def ctrl_c(script: str, pids: Path, again: bool = False) -> tuple[int, str]:
    """Runs ``script`` in a session of its own and, once the test run it starts wrote its two pids, sends its process
    group SIGINT, as Ctrl-C does (``again``: a second time, 0.3 s later): its exit status and output."""
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    for _ in range(300):
        if pids.exists() and len(pids.read_text(encoding="utf-8").split()) == 2:
            break
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    if again:
        time.sleep(0.3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    return process.returncode, out.decode()


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, nor a zombie (an orphan whose end init has not collected yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
