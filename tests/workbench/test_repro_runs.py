"""Tests for utils/repro/runs.py: the DDP worker's process group ends with its gloo threads (issue 23)."""

import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))


def gloo_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's thread names from /proc")
@pytest.mark.skipif(not gloo_available(), reason="this torch build has no gloo backend (torch.distributed)")
@pytest.mark.parametrize("imports_first", [True, False], ids=["worker-order", "imported-after-init"])
def test_destroying_the_ddp_workers_process_group_stops_its_gloo_threads(tmp_path, imports_first):
    """
    Issue 23: `torch.distributed.nn.functional`, imported while a default group exists, holds it in its functions'
    defaults, so that `destroy_process_group()` cannot free it and its gloo threads run on until interpreter exit
    (where a process sometimes aborted). The DDP worker imports it, and transformers, before creating the group.
    One process, a group of one, in a fresh interpreter that ends with os._exit (the second case is the bug).
    """
    script = f"""
import gc, os, sys, time
sys.path.insert(0, {str(REPO_ROOT / "utils")!r})
import torch.distributed as dist
from repro import runs
if {imports_first}:
    runs.import_before_process_group()
dist.init_process_group("gloo", init_method={(tmp_path / "store").as_uri()!r}, rank=0, world_size=1)
import torch.distributed.nn
# gloo's threads name themselves once running: on a loaded machine, right after init some are still unnamed
deadline = time.monotonic() + 60
while "pt_gloo_runloop" not in runs.thread_names() and time.monotonic() < deadline:
    time.sleep(0.01)
before = [name for name in runs.thread_names() if "gloo" in name]
gc.collect()
dist.destroy_process_group()
print(len(before), [name for name in runs.thread_names() if "gloo" in name], flush=True)
os._exit(0)
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    threads_before, threads_after = completed.stdout.split(maxsplit=1)
    assert int(threads_before) > 0
    if imports_first:
        assert threads_after.strip() == "[]"
    else:
        assert "pt_gloo_runloop" in threads_after
