"""Tests for `make clone-venv` (utils/workbench/clonevenv.py) on a fake clone whose `testing` extra names one
requirement a local find-links folder has, one whose dependency no index has, and one no index has. pip runs offline
(PIP_NO_INDEX, PIP_FIND_LINKS) and the new venv sees this venv's packages (pytest, torch) through PYTHONPATH: the fake
project pins the torch installed here, which pip then finds installed (nothing is downloaded)."""

import importlib.metadata
import json
import sysconfig
from pathlib import Path

import pytest
from test_fork import run, write
from test_open import CLONE_FILES, make_clone, setup  # noqa: F401 (the fixture)


# The fake clone's in-tree PEP 517/660 build backend (no download to build it): an editable wheel whose metadata
# declares the `testing` extra. Its write_wheel also makes the find-links folder's wheels.
BACKEND = '''
import base64, hashlib, os, zipfile

METADATA = """Metadata-Version: 2.1
Name: fakepkg
Version: 1.0
Provides-Extra: testing
Requires-Dist: localdep; extra == "testing"
Requires-Dist: needsmissing; extra == "testing"
Requires-Dist: nowhere-dep>=1; extra == "testing"
"""


def write_wheel(directory, name, files, requires=()):
    dist = f"{name}-1.0.dist-info"
    metadata = f"Metadata-Version: 2.1\\nName: {name}\\nVersion: 1.0\\n" + "".join(f"Requires-Dist: {r}\\n" for r in requires)
    files = {f"{dist}/METADATA": metadata, **files}
    files[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    filename = f"{name}-1.0-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(directory, filename), "w") as wheel:
        for rel, text in files.items():
            data = text.encode()
            wheel.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}\\n")
        wheel.writestr(f"{dist}/RECORD", "".join(record) + f"{dist}/RECORD,,\\n")
    return filename


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    files = {"fakepkg.pth": os.path.abspath("src") + "\\n", "fakepkg-1.0.dist-info/METADATA": METADATA}
    return write_wheel(wheel_directory, "fakepkg", files)


build_wheel = build_editable
'''
PYPROJECT = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
NEEDS_LOCALDEP = "import localdep  # noqa\n\n\ndef test_localdep():\n    pass\n"


@pytest.fixture
def clone_venv(setup, tmp_path, monkeypatch):  # noqa: F811
    """The fake workbench, a clone whose tests/trainer needs its `testing` extra, and pip offline on a find-links
    folder with localdep and needsmissing (which needs nowhere-too)."""
    root, _ = setup
    config = json.loads((root / "patches/config.json").read_text(encoding="utf-8"))
    config["pins"] = {"torch": importlib.metadata.version("torch")}
    write(root / "patches/config.json", json.dumps(config))
    files = {**CLONE_FILES, "pyproject.toml": PYPROJECT, "backend.py": BACKEND}
    clone = make_clone(tmp_path / "venv-clone", {**files, "tests/trainer/test_localdep.py": NEEDS_LOCALDEP})
    links = tmp_path / "links"
    links.mkdir()
    backend = {}
    exec(BACKEND, backend)
    backend["write_wheel"](str(links), "localdep", {"localdep.py": ""})
    backend["write_wheel"](str(links), "needsmissing", {"needsmissing.py": ""}, ["nowhere-too"])
    for name, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_CONFIG_FILE": "/dev/null"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", sysconfig.get_paths()["purelib"])  # pytest, for the new venv
    return root, clone


def clone_venv_(root: Path, clone: Path, out: Path) -> int:
    return run(root, "clone-venv", "--clone", str(clone), "--out", str(out), "--venv", str(root.parent / "venv"))


def site_packages(venv: Path) -> list[str]:
    (lib,) = (venv / "lib").glob("python3*/site-packages")
    return sorted(p.name for p in lib.iterdir())


def test_the_venv_gets_what_the_index_has_names_the_rest_and_collects_the_suite(clone_venv, tmp_path, capsys):
    root, clone = clone_venv
    out = tmp_path / "clone-venv"
    write(clone / "tests/trainer/test_nowhere.py", "import nowhere_dep  # noqa\n")  # not in git: the clone as it is
    assert clone_venv_(root, clone, out) == 1
    captured = capsys.readouterr()
    left = (
        "left out (no release on the package index satisfies them): nowhere-dep>=1, needsmissing (needs nowhere-too)"
    )
    (error,) = [line for line in captured.err.splitlines() if line.strip()]
    assert error == (
        f"fork.py clone-venv: error: {out}: upstream's tests/trainer does not collect with it: "
        f"tests/trainer/test_nowhere.py: ModuleNotFoundError: No module named 'nowhere_dep'; {left}"
    )
    steps = [line.split(" install ", 1)[1] for line in captured.out.splitlines() if line.startswith("+ ")]
    torch = importlib.metadata.version("torch")
    assert [step.split(" ", 2)[2] for step in steps[:2]] == [f"torch=={torch}", f"--no-deps -e {clone}"]
    installed = site_packages(out)
    assert not any(name.startswith("torch") for name in installed)  # this venv's, through PYTHONPATH
    assert "localdep.py" in installed and "fakepkg.pth" in installed and "needsmissing.py" not in installed
    assert json.loads((out / ".workbench-clone-venv.json").read_text(encoding="utf-8")) == {"clone": str(clone)}

    (clone / "tests/trainer/test_nowhere.py").unlink()
    assert clone_venv_(root, clone, out) == 0  # it goes on in the venv it made
    lines = capsys.readouterr().out.splitlines()
    assert f"clone-venv: going on in {out} for {clone}" in lines
    assert lines[-1] == f"clone-venv: {out}: 4 tests of tests/trainer collected; {left}"


@pytest.mark.parametrize("case", ["not a clone", "out holds a file", "out is a file", "out is a foreign venv"])
def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(clone_venv, tmp_path, capsys, case):
    root, clone = clone_venv
    out = tmp_path / "out"
    if case == "not a clone":
        clone = tmp_path / "links"
        expected = "is not a git clone (no .git)"
    elif case == "out is a file":
        write(out, "mine\n")
        expected = "exists and is not an empty folder or a venv made by clone-venv"
    else:
        write(out / ("pyvenv.cfg" if case == "out is a foreign venv" else "notes.txt"), "mine\n")
        expected = "exists and is not an empty folder or a venv made by clone-venv"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert clone_venv_(root, clone, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and err.startswith("fork.py clone-venv: error: ")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_ctrl_c_is_one_line_and_status_130_and_the_same_command_goes_on(clone_venv, tmp_path, monkeypatch, capsys):
    """Ctrl-C landing as `python -m venv` ends: the line says to run the same command again, which then goes on (the
    venv, not yet marked as this command's, was refused as someone else's folder)."""
    from workbench import clonevenv

    real = clonevenv.subprocess.run

    def venv_then_ctrl_c(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    root, clone, out = *clone_venv, tmp_path / "out"
    monkeypatch.setattr(clonevenv.subprocess, "run", venv_then_ctrl_c)
    assert clone_venv_(root, clone, out) == 130
    err = capsys.readouterr().err.strip()
    assert err == (
        "fork.py clone-venv: interrupted: the venv is left as far as it got; run the same command again: it goes on "
        "there."
    )
    monkeypatch.setattr(clonevenv.subprocess, "run", real)
    assert clone_venv_(root, clone, out) == 0
    assert f"clone-venv: going on in {out}" in capsys.readouterr().out
