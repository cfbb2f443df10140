"""Tests for `make open` (utils/workbench/opener.py) and `build --clone` on small fake upstream clones: a git repository
with src/transformers and a tests/trainer tree, and PRs whose patches are made against it (real git and pytest, no
network, no GPU, upstream's suite run without pytest-xdist workers to stay fast)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_fork import (
    ACCELERATE_FILES,
    USER,
    description,
    fake_venv,
    make_sdist,
    pr_entry,
    run,
    set_stack,
    sh,
    write,
    write_text,
)


# Far enough apart that the PRs' edits apply one after the other
TRAINER = (
    "import os\n\nSCALE = 1\n\n\ndef scale():\n    return SCALE\n\n\n# one\n# two\n# three\n\nHOME = 1\n\n# four\n"
    "# five\n# six\n\n\ndef log():\n    pass\n\n\n# seven\n# eight\n# nine\n"
)
HOME = "def test_home():\n    pass\n"
CLONE_FILES = {
    "pyproject.toml": "[project]\nname = 'fakepkg'\n",
    "PKG-INFO": "Name: fakepkg\nVersion: 1.0\n",
    "src/transformers/__init__.py": "__version__ = '1.0'\n",
    "src/transformers/trainer.py": TRAINER,
    "tests/__init__.py": "",
    "tests/trainer/__init__.py": "",
    "tests/trainer/test_basic.py": "from transformers import trainer\n\n\ndef test_scale_is_one():\n"
    "    assert trainer.scale() == 1\n\n\ndef test_log():\n    trainer.log()\n",
    "tests/trainer/test_home.py": HOME,
}
IDENTITY = ["-c", "user.name=Clone Dev", "-c", "user.email=clone@example.invalid"]


def commit(repo: Path, message: str, edits: dict[str, str | None]) -> None:
    for rel, text in edits.items():
        if text is None:
            (repo / rel).unlink()
        else:
            write(repo / rel, text)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", *USER, "commit", "-q", "-m", message)


def make_clone(path: Path, files: dict[str, str]) -> Path:
    """A contributor's clone of upstream: its main holds ``files``; user.name and user.email set."""
    for rel, text in files.items():
        write(path / rel, text)
    sh(path, "git", "init", "-q", "-b", "main")
    commit(path, "upstream main", {})
    sh(path, "git", "config", "user.name", "Clone Dev")
    sh(path, "git", "config", "user.email", "clone@example.invalid")
    return path


def format_patch(clone: Path, tmp: Path, message: str, edits: dict[str, str]) -> bytes:
    """A `git format-patch` of ``edits`` made on the clone's main."""
    work = tmp / f"work-{abs(hash(message))}"
    sh(tmp, "git", "clone", "-q", str(clone), str(work))
    commit(work, message, edits)
    return subprocess.run(
        ["git", "format-patch", "-1", "--stdout", "--zero-commit", "--full-index", "--no-signature", "-k"],
        cwd=work,
        check=True,
        capture_output=True,
    ).stdout


SCALE_TEST = "from transformers import trainer\n\n\ndef test_scale_is_two():\n    assert trainer.scale() == 2\n"
LOG_TEST = (
    "import os\n\nfrom transformers import trainer\n\n\ndef test_log_sets(monkeypatch):\n"
    "    monkeypatch.setenv('LEAKED', '0')\n    trainer.log()\n    assert os.environ['LEAKED'] == '1'\n"
)
MOVED_TEST = "from transformers import trainer\n\n\ndef test_home_moved():\n    assert trainer.HOME == 3\n"
HOME_EDITED = (
    HOME
    + "\n\nclass TestHome:\n    def test_scale(self):\n        from transformers import trainer\n\n"
    + ("        assert trainer.HOME == 3\n")
)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A fake workbench (its venv: this Python) with four transformers PRs made against a fake clone of upstream main:
    fix-scale (changes an upstream test's outcome), leaky (adds a leak to an upstream test), moves-tests (its tests go
    into upstream's test_home.py) and no-bug (its test passes without its fix)."""
    root, clone = tmp_path / "repo", make_clone(tmp_path / "transformers", CLONE_FILES)
    (root / "build/cache").mkdir(parents=True)
    sha = make_sdist(root / "build/cache/fakepkg-1.0.tar.gz", CLONE_FILES)
    acc_sha = make_sdist(root / "build/cache/fakeacc-1.0.tar.gz", ACCELERATE_FILES, "fakeacc-1.0")
    config = {
        "upstreams": {
            "transformers": {
                "package": "fakepkg",
                "module": "transformers",
                "version": "1.0",
                "sha256": sha,
                "overlay": ["src/transformers", "tests/trainer"],
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
    write(root / "patches/config.json", json.dumps(config))
    write(root / "patches/accelerate/.patches", "")
    patches = {
        "fix-scale": ({"src/transformers/trainer.py": TRAINER.replace("SCALE = 1", "SCALE = 2")}, SCALE_TEST),
        "leaky": (
            {"src/transformers/trainer.py": TRAINER.replace("    pass", "    os.environ['LEAKED'] = '1'")},
            LOG_TEST,
        ),
        "moves-tests": ({"src/transformers/trainer.py": TRAINER.replace("HOME = 1", "HOME = 3")}, MOVED_TEST),
        "no-bug": ({"src/transformers/trainer.py": TRAINER + "\n\ndef unused():\n    pass\n"}, HOME),
    }
    entries = []
    for name, (edits, test) in patches.items():
        patch = f"{name}.patch"
        write_bytes(root / "patches/transformers" / patch, format_patch(clone, tmp_path, f"Fix {name}", edits))
        overlay = f"tests/trainer/test_{name.replace('-', '_')}.py"
        write(root / overlay, test)
        write_text(root / f"docs/pr/{name}.md", description(f"Fixes {name}."))
        entries.append(pr_entry(name, patches=[patch], overlay=[overlay], tests=[overlay]))
    home_patch = format_patch(clone, tmp_path, "Test the scale at home", {"tests/trainer/test_home.py": HOME_EDITED})
    write_bytes(root / "patches/transformers-tests/moves-tests.patch", home_patch)
    entries[2].update(
        upstream_test_patch="patches/transformers-tests/moves-tests.patch", belongs_in="tests/trainer/test_home.py"
    )
    write(root / "patches/transformers/.patches", "".join(f"{name}.patch\n" for name in patches))
    set_stack(root, entries)
    fake_venv(root.parent)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # faster: the runs here need no installed plugin
    return root, clone


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def open_(root: Path, clone: Path, *args: str) -> int:
    venv = root.parent / "venv"
    return run(root, "open", "--clone", str(clone), "--venv", str(venv), "--workers", "0", *args)


def branches(clone: Path) -> list[str]:
    return sh(clone, "git", "for-each-ref", "--format=%(refname:short)", "refs/heads").split()


def table_of(out: str, pr: str) -> str:
    return out.split(f"\nPR {pr}: branch ")[1].split("\n\n")[0]


def test_open_makes_each_branch_from_main_and_proves_it_there(setup, capsys):
    root, clone = setup
    sh(clone, "git", "checkout", "-q", "-b", "mine")  # a branch of the contributor's, checked out
    commit(clone, "work of my own", {"notes.txt": "mine\n"})
    before = (sh(clone, "git", "status", "--porcelain"), sh(clone, "git", "rev-parse", "mine"))
    assert open_(root, clone) == 1  # not every PR is ready
    out = capsys.readouterr().out
    assert sh(clone, "git", "branch", "--show-current").strip() == "mine"
    assert (sh(clone, "git", "status", "--porcelain"), sh(clone, "git", "rev-parse", "mine")) == before
    assert sh(clone, "git", "worktree", "list").count("\n") == 1
    assert sorted(branches(clone)) == ["fix-scale", "leaky", "main", "mine", "moves-tests", "no-bug"]
    main = sh(clone, "git", "rev-parse", "main").strip()
    for name in ("fix-scale", "leaky", "moves-tests", "no-bug"):
        assert sh(clone, "git", "merge-base", "main", name).strip() == main  # from main, not from `mine`
        assert set(sh(clone, "git", "log", "--format=%an <%ae>", f"main..{name}").split("\n")) == {
            "Clone Dev <clone@example.invalid>",
            "",
        }
    # The PR whose test home exists in the clone: its test edit in upstream's file, not its new file
    files = sh(clone, "git", "ls-tree", "-r", "--name-only", "moves-tests").split()
    assert "tests/trainer/test_moves_tests.py" not in files
    assert "class TestHome" in sh(clone, "git", "show", "moves-tests:tests/trainer/test_home.py")
    assert "tests/trainer/test_fix_scale.py" in sh(clone, "git", "ls-tree", "-r", "--name-only", "fix-scale")

    fix = table_of(out, "fix-scale")
    assert "tests with its fix        pass (1 passed)" in fix
    assert "tests without its fix     fail, as they must (test_scale_is_two: failed)" in fix
    assert "tests/trainer/test_basic.py::test_scale_is_one: passed -> failed" in fix
    assert "ready to push             no (upstream outcome changes)" in fix
    leaky = table_of(out, "leaky")
    assert "added: tests/trainer/test_basic.py::test_log (environment" in leaky and "LEAKED" in leaky
    assert "test_scale_is_one" not in leaky  # attributed to fix-scale only
    assert "upstream outcome changes  none" in leaky and "ready to push             no (leaks)" in leaky
    moved = table_of(out, "moves-tests")
    assert "in upstream's tests/trainer/test_home.py" in moved
    assert "(1 passed)" in moved and "fail, as they must (test_scale: failed)" in moved
    assert "ready to push             yes" in moved and "new tests failing" not in moved
    assert "PASS: they do not show the bug" in table_of(out, "no-bug")
    assert "GPU check: not run, no CUDA" in out
    assert "  outcome changed: 1" in out and "3 tests (3 passed)" in out
    assert "1 of 4 PR(s) ready to push" in out

    # Run again: the branches exist, so nothing is made without --force
    assert open_(root, clone, "--pr", "moves-tests") == 2
    assert "branch moves-tests exists" in capsys.readouterr().err
    assert open_(root, clone, "--pr", "moves-tests", "--force") == 0


def test_build_clone_starts_from_main_not_from_the_checked_out_branch(setup, capsys):
    root, clone = setup
    assert run(root, "build", "--clone", str(clone), "--pr", "fix-scale", "--no-install") == 0
    sh(clone, "git", "checkout", "-q", "fix-scale")
    assert run(root, "build", "--clone", str(clone), "--pr", "leaky", "--no-install") == 0
    assert "holds leaky on main" in capsys.readouterr().out
    assert sh(clone, "git", "rev-list", "--count", "main..leaky").strip() == "2"  # its tests and its fix only
    assert "SCALE = 1" in sh(clone, "git", "show", "leaky:src/transformers/trainer.py")
    assert sh(clone, "git", "branch", "--show-current").strip() == "fix-scale"
    assert run(root, "build", "--clone", str(clone), "--pr", "no-bug", "--base", "leaky", "--no-install") == 2
    assert "is a PR's branch" in capsys.readouterr().err


def test_a_conflict_stops_with_the_file_and_leaves_no_branch(setup, capsys):
    root, clone = setup
    commit(clone, "upstream moved", {"src/transformers/trainer.py": TRAINER.replace("SCALE = 1", "SCALE = 5")})
    assert open_(root, clone, "--pr", "fix-scale") == 1
    err = capsys.readouterr().err
    assert "PR fix-scale: patches/transformers/fix-scale.patch does not apply on main" in err
    assert "conflict in src/transformers/trainer.py" in err and "--keep-conflict" in err
    assert branches(clone) == ["main"] and sh(clone, "git", "worktree", "list").count("\n") == 1
    # Asked to keep it: the branch, in the middle of `git am`, in a worktree next to the clone
    assert open_(root, clone, "--pr", "fix-scale", "--keep-conflict") == 1
    kept = clone.parent / "transformers-fix-scale"
    assert "git am --continue" in capsys.readouterr().err and (kept / ".git").exists()
    assert (Path(sh(kept, "git", "rev-parse", "--absolute-git-dir").strip()) / "rebase-apply").exists()
    assert "fix-scale" in branches(clone)


def test_tests_stay_in_their_new_file_where_the_clone_lacks_their_home(setup, capsys):
    root, clone = setup
    commit(clone, "no home", {"tests/trainer/test_home.py": None})
    assert open_(root, clone, "--pr", "moves-tests") == 0
    out = capsys.readouterr().out
    assert "its home tests/trainer/test_home.py is not in the clone" in out
    assert "tests/trainer/test_moves_tests.py" in sh(clone, "git", "ls-tree", "-r", "--name-only", "moves-tests")


def test_a_test_edit_that_does_not_apply_is_refused_by_name(setup, capsys):
    root, clone = setup
    commit(clone, "home moved on", {"tests/trainer/test_home.py": "def test_home():\n    assert True\n"})
    assert open_(root, clone, "--pr", "moves-tests") == 1
    err = capsys.readouterr().err
    assert "patches/transformers-tests/moves-tests.patch does not apply" in err
    assert "tests/trainer/test_home.py" in err and branches(clone) == ["main"]


def test_upstream_tests_that_stop_collecting_are_named_per_file(setup, capsys):
    root, clone = setup
    renamed = TRAINER.replace("def log():", "def write_log():")
    patch = format_patch(clone, root.parent, "Rename log", {"src/transformers/trainer.py": renamed})
    write_bytes(root / "patches/transformers/no-bug.patch", patch)
    write(root / "tests/trainer/test_no_bug.py", "from transformers.trainer import write_log  # noqa\n\n\n" + HOME)
    commit(
        clone,
        "a test that imports log",
        {"tests/trainer/test_imports.py": "from transformers.trainer import log\n" + HOME.replace("home", "imports")},
    )
    assert open_(root, clone, "--pr", "no-bug") == 1
    out = capsys.readouterr().out
    assert (
        "not collected on branch no-bug: tests/trainer/test_imports.py: ImportError: cannot import name 'log'" in out
    )
    assert "tests/trainer/test_imports.py: does not collect" in table_of(out, "no-bug")


@pytest.mark.parametrize(
    "case",
    [
        "no clone named",
        "not a clone",
        "other upstream",
        "dirty",
        "git am",
        "no identity",
        "no tests",
        "pytest refuses",
    ],
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(setup, tmp_path, monkeypatch, capsys, case):
    root, clone = setup
    args = []
    if case == "no clone named":
        assert run(root, "open", "--clone", "") == 2
        assert "name your clone of upstream: make open CLONE=" in capsys.readouterr().err
        return
    if case == "not a clone":
        clone = tmp_path / "plain"
        clone.mkdir()
        expected = "is not a git clone"
    elif case == "other upstream":
        clone = make_clone(tmp_path / "accelerate", ACCELERATE_FILES)
        args, expected = ["--pr", "fix-scale"], "PR fix-scale is a transformers PR, but"
    elif case == "dirty":
        write(clone / "src/transformers/trainer.py", "edited\n")
        expected = "has uncommitted changes (src/transformers/trainer.py)"
    elif case == "git am":
        (Path(sh(clone, "git", "rev-parse", "--absolute-git-dir").strip()) / "rebase-apply").mkdir()
        expected = "a `git am` is in progress"
    elif case == "no identity":
        sh(clone, "git", "config", "--unset", "user.name")
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
        expected = "git user.name is not set"
    elif case == "pytest refuses":
        args = ["--pytest-args=--bogus-opt"]
        expected = "--pytest-args: pytest refuses '--bogus-opt': unrecognized arguments: --bogus-opt"
    else:
        commit(clone, "no tests import", {"tests/trainer/conftest.py": "import nothing_here\n"})
        args, expected = ["--pr", "moves-tests"], "upstream's tests/trainer does not run on main"
    state = sh(clone, "git", "for-each-ref") if (clone / ".git").exists() else ""
    assert open_(root, clone, *args) == 2
    err = capsys.readouterr().err
    assert expected in err and err.startswith("fork.py open: error: ")
    assert (sh(clone, "git", "for-each-ref") if (clone / ".git").exists() else "") == state


def test_outcome_log_plugin_records_each_outcome(tmp_path):
    write(
        tmp_path / "test_x.py",
        "import pytest\n\n\ndef test_ok():\n    pass\n\n\ndef test_bad():\n    assert 0\n\n\n@pytest.mark.xfail\n"
        "def test_xf():\n    assert 0\n\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n\n"
        "def test_error(broken):\n    pass\n\n\n@pytest.fixture\ndef leaks():\n    yield\n"
        "    raise AssertionError('test_leaks left process-global state changed (put back for the next test)')\n\n\n"
        "def test_leaks(leaks):\n    pass\n",
    )
    write(tmp_path / "test_y.py", "import nothing_here\n")
    write(tmp_path / "test_z.py", "raise ImportError('fakehub>=2 is required.\\nTry: pip install -U')\n")
    log = tmp_path / "log.json"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "utils")}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "pytest_outcome_log",
        f"--outcome-log={log}",
        "-p",
        "no:cacheprovider",
    ]
    subprocess.run([*cmd, "--continue-on-collection-errors", "-q", str(tmp_path)], cwd=tmp_path, env=env, check=False)
    data = json.loads(log.read_text(encoding="utf-8"))
    assert data["tests"] == {
        "test_x.py::test_ok": "passed",
        "test_x.py::test_bad": "failed",
        "test_x.py::test_xf": "xfailed",
        "test_x.py::test_error": "error",
        "test_x.py::test_leaks": "passed",  # the guard's error: a leak, which its own log names
    }
    assert (
        list(data["collect_errors"]) == ["test_y.py", "test_z.py"]
        and "nothing_here" in data["collect_errors"]["test_y.py"]
    )
    assert data["collect_errors"]["test_z.py"] == "ImportError: fakehub>=2 is required."  # the error, not its advice


def test_with_cuda_the_gpu_check_summary_replaces_the_placeholder_in_dist(setup, monkeypatch, capsys):
    from workbench import opener, texts

    root, clone = setup
    monkeypatch.setattr(opener, "has_cuda", lambda python: True)
    write(  # a stand-in for bench/gpu_check.py: its summary file and exit status, as the real one writes them
        root / "bench/gpu_check.py",
        "import pathlib, sys\nout = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\nout.mkdir(parents=True)\n"
        "(out / 'gpu_check.txt').write_text('gpu_check 2026-12-04  exit 0\\npython 3.12.3  torch 2.11.0+cu130 (abc)  '\n"
        "'GPU NVIDIA H200  pytest 9.1.1\\nparity: passed (expected)\\n  passed  tests/x.py::T::t (1 s)\\n')\n",
    )
    text = root / "dist/03-moves-tests/PR_DESCRIPTION.md"
    # The line that `make check` wants in each description whose change has a CUDA-only path (texts.py)
    assert opener.GPU_PLACEHOLDER == texts.NOT_RUN_ON_GPU
    write(text, f"On CPU in-process.\n{opener.GPU_PLACEHOLDER}\n")
    assert open_(root, clone, "--pr", "moves-tests") == 0
    assert "GPU                       passed" in table_of(capsys.readouterr().out, "moves-tests")
    assert text.read_text(encoding="utf-8") == (
        "On CPU in-process.\nRun on a GPU (NVIDIA H200, torch 2.11.0+cu130): parity: passed (expected).\n"
    )


# --------------------------------------------------------------------------------------------------------------
# A clone that lacks the release's files, PRs that do not apply, failures at each stage, Ctrl-C, the statuses


MOVED_ON = TRAINER.replace("# two", "# two (upstream moved on)")  # the fix's context differs; three-way merges it


def clone_of(source: Path, path: Path, *options: str) -> Path:
    sh(source.parent, "git", "clone", "-q", *options, f"file://{source}", str(path))
    sh(path, "git", "config", "user.name", "Clone Dev")
    sh(path, "git", "config", "user.email", "clone@example.invalid")
    return path


def fetch_command(err: str) -> list[str]:
    """The command the message gives to fetch what is missing (one line, starting with `git -C`)."""
    (line,) = [line.strip() for line in err.splitlines() if line.strip().startswith("git -C ")]
    return line.split()


@pytest.mark.parametrize("case", ["shallow", "older main"])
def test_a_clone_without_the_release_files_is_told_how_to_fetch_them(setup, tmp_path, capsys, case):
    root, upstream = setup
    sh(upstream, "git", "tag", "v1.0")  # the release the patches are made on
    if case == "shallow":  # upstream's main moved on; a contributor's `git clone --depth 1` of it
        commit(upstream, "upstream moved on", {"src/transformers/trainer.py": MOVED_ON})
        clone = clone_of(upstream, tmp_path / "shallow", "--depth", "1")
        expected = "the clone is shallow"
    else:  # a clone of a main older than the release (its files never fetched)
        older = make_clone(tmp_path / "upstream-old", {**CLONE_FILES, "src/transformers/trainer.py": MOVED_ON})
        sh(older, "git", "fetch", "-q", str(upstream), "tag", "v1.0")
        clone = clone_of(older, tmp_path / "older", "--no-tags", "--single-branch")
        expected = "the clone's history lacks fakepkg 1.0"
    assert open_(root, clone, "--pr", "moves-tests") == 1
    captured = capsys.readouterr()
    assert "PR moves-tests: patches/transformers/moves-tests.patch does not apply on main" in captured.err
    assert "conflict in src/transformers/trainer.py" in captured.err
    assert "git: error: Repository lacks necessary blobs to fall back on 3-way merge." in captured.err
    assert expected in captured.err and "applies        no: moves-tests.patch does not apply" in captured.out
    assert branches(clone) == ["main"] and sh(clone, "git", "worktree", "list").count("\n") == 1
    command = fetch_command(captured.err)
    assert command[-2:] == ["tag", "v1.0"] and ("--depth" in command) == (case == "shallow")
    sh(tmp_path, *command)  # what the message says to run
    assert open_(root, clone, "--pr", "moves-tests") == 0
    assert "ready to push             yes" in table_of(capsys.readouterr().out, "moves-tests")


def test_every_pr_is_tried_and_one_that_does_not_apply_gets_its_row(setup, capsys):
    root, clone = setup
    commit(clone, "upstream moved", {"src/transformers/trainer.py": TRAINER.replace("SCALE = 1", "SCALE = 5")})
    assert open_(root, clone) == 1
    captured = capsys.readouterr()
    assert "PR fix-scale: patches/transformers/fix-scale.patch does not apply on main" in captured.err
    assert "git: CONFLICT (content): Merge conflict in src/transformers/trainer.py" in captured.err
    row = table_of(captured.out, "fix-scale")
    assert "applies        no: fix-scale.patch does not apply, even three-way (src/transformers/trainer.py)" in row
    assert "ready to push  no (applies)" in row
    assert "ready to push             yes" in table_of(captured.out, "moves-tests")  # the others went on
    assert "1 of 4 PR(s) ready to push" in captured.out
    assert sorted(branches(clone)) == ["leaky", "main", "moves-tests", "no-bug"]
    assert sh(clone, "git", "worktree", "list").count("\n") == 1


def test_the_import_error_is_shown_where_upstreams_tests_do_not_import(setup, capsys):
    """As transformers' own version check words it: the ImportError, then its advice, which is not the cause."""
    root, clone = setup
    advice = "Try: `pip install transformers -U` or `pip install -e '.[dev]'` if you're working with git main"
    init = f'raise ImportError("fakehub>=2 is required, but found fakehub==1.\\n{advice}")\n'
    conftest = "import transformers  # noqa\n"
    commit(clone, "needs fakehub 2", {"src/transformers/__init__.py": init, "tests/trainer/conftest.py": conftest})
    assert open_(root, clone, "--pr", "moves-tests") == 2
    err = capsys.readouterr().err
    assert "does not run on main (" in err
    assert "tests/trainer: ImportError: fakehub>=2 is required, but found fakehub==1." in err
    assert "Try: `pip install" not in err and "--venv DIR" in err
    assert branches(clone) == ["main"] and sh(clone, "git", "worktree", "list").count("\n") == 1


def test_pytest_options_of_the_clones_conftest_are_taken(setup, capsys):
    """--pytest-args are checked by pytest before anything is made, with the clone's root conftest.py, whose options
    (upstream's `--make-reports`) the workbench's own check refused."""
    root, clone = setup
    conftest = "def pytest_addoption(parser):\n    parser.addoption('--clone-option', action='store_true')\n"
    commit(clone, "an option of upstream's", {"conftest.py": conftest})
    assert open_(root, clone, "--pr", "no-bug", "--pytest-args=--clone-option") == 1  # no-bug's tests pass without it
    captured = capsys.readouterr()
    assert "refuses" not in captured.err and "no-bug" in captured.out


def test_the_workbench_fork_is_refused_as_a_clone(setup, capsys):
    root, _ = setup
    fork = make_clone(root / "build/transformers", CLONE_FILES)
    assert open_(root, fork) == 2
    assert "is the workbench's fork of transformers" in capsys.readouterr().err
    assert branches(fork) == ["main"] and sh(fork, "git", "worktree", "list").count("\n") == 1


class Stop(Exception):
    pass


def stop_at(monkeypatch, target, name: str, call: int, error: BaseException) -> None:
    """Make the ``call``-th call of ``target.name`` raise ``error`` (the calls before it run as they would)."""
    real, calls = getattr(target, name), []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, stopping)


STAGES = {  # where a run stops: (what is called, which call of it); all PRs up to the stacking, one PR after it
    "the stock tree": ("build_stock", 1),
    "the third branch": ("make_branch", 3),
    "stacking the PRs": ("git", None),
    "upstream's suite on main": ("Runner.run", 1),
    "a PR's own tests": ("Runner.run", 3),
    "undoing a fix": ("remove_fix", 1),
    "the GPU check": ("gpu_check", 1),
}
ALL_PRS = ("the stock tree", "the third branch", "stacking the PRs")


def terminate(*args, **kwargs):
    """What `kill` or `timeout` does: SIGTERM to the process (the test's own handler stands in if `open` has none)."""
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize(
    "stage, interrupt",
    [*((stage, False) for stage in STAGES), *((s, True) for s in ("the third branch", "upstream's suite on main"))]
    + [("a PR's own tests", "SIGTERM")],
)
def test_a_run_stopped_at_any_stage_leaves_no_worktree_branch_or_temporary_folder(
    setup, tmp_path, monkeypatch, capsys, request, stage, interrupt
):
    from workbench import opener

    root, clone = setup
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    error = KeyboardInterrupt() if interrupt else opener.ForkError(f"stopped at {stage}")
    name, call = STAGES[stage]
    if interrupt == "SIGTERM":

        def unhandled(*args):
            raise Stop("open let SIGTERM through")

        previous = signal.signal(signal.SIGTERM, unhandled)
        request.addfinalizer(lambda: signal.signal(signal.SIGTERM, previous))
        monkeypatch.setattr(opener.Runner, "run", terminate)
    elif name == "git":  # the first cherry-pick onto the stacked worktree
        real = opener.git

        def git(cwd, *args, **kwargs):
            if args[:1] == ("cherry-pick",):
                raise error
            return real(cwd, *args, **kwargs)

        monkeypatch.setattr(opener, "git", git)
    elif name == "Runner.run":
        stop_at(monkeypatch, opener.Runner, "run", call, error)
    else:
        stop_at(monkeypatch, opener, name, call, error)
    try:
        status = open_(root, clone, *([] if stage in ALL_PRS else ["--pr", "moves-tests"]))
    except KeyboardInterrupt:
        status = "KeyboardInterrupt escaped"
    capsys_out, err = capsys.readouterr()
    if interrupt:
        assert status == 130 and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("fork.py open: interrupted: no branch was made")
    else:
        assert status == 1 and f"stopped at {stage}" in err
    made = ["main"]
    if stage == "the third branch" and not interrupt:  # that PR's failure is its row, and the others go on
        assert "applies        no: its branch could not be made: stopped at" in table_of(capsys_out, "moves-tests")
        made = ["fix-scale", "leaky", "main", "no-bug"]
    assert sorted(branches(clone)) == made and sh(clone, "git", "worktree", "list").count("\n") == 1
    assert list(temp.iterdir()) == []
    if interrupt == "SIGTERM":
        assert signal.getsignal(signal.SIGTERM) is unhandled  # put back as it was


def test_ctrl_c_inside_git_worktree_add_leaves_no_worktree(setup, tmp_path, monkeypatch, capsys):
    """Stopped inside `git worktree add`, git leaves the new worktree locked ("initializing"), which prune skips."""
    from workbench import opener

    root, clone = setup
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    real = opener.git

    def git(cwd, *args, **kwargs):
        proc = real(cwd, *args, **kwargs)
        if args[:2] == ("worktree", "add"):
            path = next(arg for arg in args[2:] if not arg.startswith("-"))
            real(cwd, "worktree", "lock", "--reason", "initializing", path)  # as git is when Ctrl-C stops it
            raise KeyboardInterrupt
        return proc

    monkeypatch.setattr(opener, "git", git)
    assert open_(root, clone, "--pr", "moves-tests") == 130
    assert sh(clone, "git", "worktree", "list").count("\n") == 1
    assert sorted(branches(clone)) == ["main"] and not list(tmp_path.glob("workbench-open-*"))


def test_the_branches_are_made_all_or_none(setup, capsys):
    root, clone = setup
    sh(clone, "git", "branch", "no-bug/mine")  # so that branch no-bug cannot be made, at the very end
    assert open_(root, clone) == 1
    assert "update-ref" in capsys.readouterr().err
    assert sorted(branches(clone)) == ["main", "no-bug/mine"]
    assert sh(clone, "git", "worktree", "list").count("\n") == 1


def test_scripts_get_the_statuses_from_the_command_make_runs(setup, tmp_path):
    """Through make every failure is make's status 2; the README gives the command make runs, which keeps 1 and 2."""
    root, clone = setup
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if ".venv/bin/python utils/fork.py open --clone" in line)
    command = line[line.index(".venv/bin/python") :].split("`")[0].split()
    makefile = (repo / "Makefile").read_text(encoding="utf-8")
    assert "VPY := $(VENV)/bin/python" in makefile and "VENV := .venv" in makefile
    assert "FORK := utils/fork.py" in makefile and "\t$(VPY) $(FORK) open --clone " in makefile
    assert command[:5] == [".venv/bin/python", "utils/fork.py", "open", "--clone", "../transformers"]
    direct = [sys.executable, str(repo / "utils/fork.py"), "open", "--repo-root", str(root), "--clone", str(clone)]
    direct += ["--venv", str(root.parent / "venv"), "--workers", "0", "--pr", "fix-scale"]
    commit(clone, "upstream moved", {"src/transformers/trainer.py": TRAINER.replace("SCALE = 1", "SCALE = 5")})
    assert subprocess.run(direct, cwd=tmp_path, capture_output=True).returncode == 1  # not ready: a conflict
    write(clone / "notes.txt", "uncommitted\n")
    assert subprocess.run(direct, cwd=tmp_path, capture_output=True).returncode == 2  # bad input
