"""
Starting processes of this package and telling how they ended: the worker command line, the two-process torchrun
launch of the DDP scenarios (`--ddp-worker`), torchrun's root cause and the last error line of a process's output, and
the record of a run lost with its process.
"""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # `python <this folder>` runs its __main__.py
DDP_TIMEOUT = 600  # seconds for the two-process runs of one variant


def worker_command(variant: str, options, worker_flag: str = "--worker") -> list[str]:
    """This package as a worker of `variant` (`--worker`; `--ddp-worker` under torchrun) with the driver's options."""
    return [
        sys.executable,
        PACKAGE_DIR,
        worker_flag,
        variant,
        "--out",
        options.out,
        "--steps",
        str(options.steps),
        "--resume-step",
        str(options.resume_step),
        "--device",
        options.device,
        "--scenarios",
        *options.scenarios,
        "--overflow-steps",
        ",".join(map(str, options.overflow_steps)),
    ]


def failed_run(error: str) -> dict:
    """The record of a run lost with its process (a worker or a torchrun launch that failed): no directory."""
    return {"dir": None, "status": "crashed", "error": error, "process_failed": True}


def _ddp_command(variant: str, options, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        "--max_restarts=0",
        *worker_command(variant, options, worker_flag="--ddp-worker")[1:],
    ]


def launch_ddp_runs(variant: str, options, base: str) -> dict:
    """
    Runs the DDP scenarios in two processes started with torchrun (`--ddp-worker`), with the `transformers` this
    worker imports. Returns their run records. On timeout, torchrun is stopped, and it stops its processes. When the
    launch fails (a process crashed or exited with an error, or the timeout), the records say why: torchrun's root
    cause (the failing rank, its exit code or signal) and the last error line of the output.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = _ddp_command(variant, options, port)
    print(f"[{variant}] ddp: running 2 processes ...", flush=True)
    ddp_dir = os.path.join(base, "ddp")
    shutil.rmtree(ddp_dir, ignore_errors=True)  # no results of an earlier launch can pass for this one's
    # torchrun never removes its log folders (`torchelastic_*`): they go to a temporary folder removed afterwards.
    tmp_dir = tempfile.mkdtemp(prefix="repro_ddp_")
    try:
        launcher = subprocess.Popen(
            command,
            env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=tmp_dir),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        output = OutputTail(launcher.stdout, sys.stdout)
        try:
            returncode = launcher.wait(timeout=DDP_TIMEOUT)
        except KeyboardInterrupt:  # in its own session, Ctrl-C does not reach it: stopped here, its output unshown
            output.mute()
            _stop(launcher)
            raise
        except subprocess.TimeoutExpired:
            _stop(launcher)
            returncode = f"timeout after {DDP_TIMEOUT} s"
        output.join(timeout=30)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    path = os.path.join(ddp_dir, "ddp.json")
    if returncode != 0 or not os.path.isfile(path):
        why = [f"torchrun exit status {returncode}" if isinstance(returncode, int) else str(returncode)]
        root_cause, last_error = torchrun_root_cause(output.lines), last_error_line(output.lines)
        why += [f"root cause: {root_cause}"] * bool(root_cause) + [f"last error: {last_error}"] * bool(last_error)
        if returncode == 0:
            why.append(f"no {path}")
        elif os.path.isfile(path):
            why.append("the results had been written")
        return {"ddp/uninterrupted": failed_run(f"the two-process run failed ({'; '.join(why)})")}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _stop(launcher: subprocess.Popen) -> None:
    """Stops torchrun: SIGTERM, on which it stops its processes (each in a session of its own), then SIGKILL."""
    launcher.terminate()
    try:
        launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


class OutputTail:
    """Copies a child's output (a text stream) line by line to `sink` as it comes, keeping the last `size` lines."""

    def __init__(self, stream, sink, size: int = 300):
        self.lines = collections.deque(maxlen=size)
        self.muted = False
        self._thread = threading.Thread(target=self._copy, args=(stream, sink), name="repro-output", daemon=True)
        self._thread.start()

    def _copy(self, stream, sink):
        with stream:
            for line in stream:
                self.lines.append(line.rstrip("\n"))
                if not self.muted:
                    sink.write(line)
                    sink.flush()

    def mute(self):
        """Stops copying to the sink (what a process stopped on purpose prints is not shown)."""
        self.muted = True

    def join(self, timeout: float | None = None):
        self._thread.join(timeout)


def signal_name(returncode) -> str | None:
    """`SIGABRT` for a return code of -6 (a process ended by a signal), else None."""
    if isinstance(returncode, int) and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return None


def torchrun_root_cause(lines) -> str | None:
    """
    Reads the "Root Cause (first observed failure)" block that torchrun prints when a process fails. Returns e.g.
    `rank 1 exited with -6 (SIGABRT)`, or None when there is no such block.
    """
    lines = list(lines)
    for index, line in enumerate(lines):
        if line.strip().startswith("Root Cause"):
            fields = {}
            for field_line in lines[index + 1 :]:
                if field_line.startswith("====="):
                    break
                match = re.match(r"\s+(\w+)\s*:\s*(.*)", field_line)
                if match:
                    fields.setdefault(match.group(1), match.group(2).strip())
            rank = re.match(r"\d+", fields.get("rank", ""))
            code = re.match(r"-?\d+", fields.get("exitcode", ""))
            if rank is None or code is None:
                return None
            name = signal_name(int(code.group()))
            return f"rank {rank.group()} exited with {code.group()}" + (f" ({name})" if name else "")
    return None


# A line of a process's output that reports its error: a Python exception (`ValueError: ...`, also behind torch's
# `[rank1]: ` prefix), a C++ abort (`terminate called ...`), a fatal signal.
_ERROR_LINE = re.compile(
    r"^(\[rank\d+\]:\s*)?([\w.]*(Error|Exception|Interrupt)\b|terminate called|Fatal Python error|Segmentation fault"
    r"|Aborted|Killed)"
)


def last_error_line(lines) -> str | None:
    """
    The last line of a launch's output that reports an error, leaving out what torchrun itself prints about the
    failure (its log lines and its own `ChildFailedError` traceback). None when there is none.
    """
    lines = list(lines)
    for index in range(len(lines) - 1, -1, -1):  # drop the launcher's own traceback
        if lines[index].startswith("Traceback (most recent call last):") and any(
            "ChildFailedError" in line for line in lines[index:]
        ):
            lines = lines[:index]
            break
    for line in reversed(lines):
        text = line.strip()
        if "torch/distributed/elastic/" in text or "ChildFailedError" in text:
            continue
        if _ERROR_LINE.match(text):
            return shorten(text, 200)
    return None


def shorten(text: str, width: int = 110) -> str:
    """`text` cut to `width` characters, ending in `...` when cut (an output line, a message, a verdict's quote)."""
    return text if len(text) <= width else text[: width - 3] + "..."
