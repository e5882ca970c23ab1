"""Process groups: start a job's tasks together, pump their output, stop them all.

Ctrl-C, SIGTERM and any error stop every task before the launcher returns, and
every task dies with the launcher (Linux's parent-death signal).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from mdtrain.errors import UsageError
from mdtrain.gpus import visible_gpus, worker_devices

HANG_EXIT_CODE = 124
HANG_TIMEOUT_S = 300.0  # the default of `mdtrain launch --hang-timeout` and of every job
_GRACE_S = 5.0  # between SIGTERM and SIGKILL: long enough to flush logs, short enough to wait
POLL_S = 0.1


def exit_status(returncode: int) -> int:
    """A `Popen.returncode` as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def child_setup() -> Callable[[], None] | None:
    """Returns a preexec_fn that makes the child die with the launcher (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # Loaded in the parent: the child runs between fork and exec and must do little.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def setup() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: SIGKILL when the launcher dies
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:  # the whole group: workers may have children of their own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


# The C++ runtime's glog lines ("E0000 00:00:1795393443.609882  30925 file.cc:252] ..."),
# absl's notice and gRPC's continuation lines: to the task's log only (docs/multi-worker.md).
_RUNTIME_LOG = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\]|:UNKNOWN:"
    r"|WARNING: All log messages before absl::InitializeLog|Additional GRPC error information"
)


class Job:
    """One launch of `tasks`: its log folder, stream, environment, each worker's GPUs, its tasks."""

    def __init__(
        self,
        num_workers: int,
        tasks: str,
        *,
        host: str = "127.0.0.1",
        log_dir: str | os.PathLike | None = None,
        hang_timeout_s: float | None = HANG_TIMEOUT_S,
        env: dict[str, str] | None = None,
        stream: TextIO | None = None,
        gpus_per_worker: int | None = None,
        most_gpus_per_worker: int | None = None,
    ):
        if hang_timeout_s is not None and hang_timeout_s <= 0:
            raise UsageError(f"hang timeout {hang_timeout_s}: pass a positive number of seconds")
        gpus = visible_gpus(env)
        if most_gpus_per_worker is not None:  # at most this many each; the rest stay unused
            gpus = gpus[: most_gpus_per_worker * num_workers]
        devices = worker_devices(num_workers, gpus, gpus_per_worker)
        chosen = gpus_per_worker is None
        # Each worker's CUDA_VISIBLE_DEVICES; None without GPUs: the launcher's environment.
        self.gpus = None if chosen and not devices.gpus else list(devices.cuda_visible_devices)
        self.hang_timeout_s = hang_timeout_s
        # CUDA numbers GPUs as NVML (the shares above, nvidia-smi, the monitor), not fastest first.
        self.env = dict(os.environ if env is None else env, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        # After the checks: a usage error leaves no log folder behind.
        self.log_dir = Path(tempfile.mkdtemp(prefix="mdtrain-") if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stream = sys.stdout if stream is None else stream  # a notebook's, if it is one
        self.lock = threading.Lock()
        self.new_attempt()
        self.say(f"{tasks} on {host}; logs in {self.log_dir}")
        if chosen and devices.gpus and not devices.gpus_per_worker:
            self.say(devices.describe())  # fewer GPUs than workers put every worker on the CPU

    def new_attempt(self) -> None:
        """Forgets the tasks of the last attempt, which were stopped; the next ones start fresh."""
        self.procs: list[subprocess.Popen] = []
        self.labels: list[str] = []
        self.last_output = time.monotonic()
        self._logs: list[TextIO] = []
        self._threads: list[threading.Thread] = []
        self._preexec = child_setup()

    def spawn(self, command: list[str], env: dict[str, str], label: str, header: str = "") -> None:
        """Starts `command` as the task `label`, its log file opened with `header` first."""
        log = open(self.log_dir / f"{label.replace(' ', '-')}.log", "a", encoding="utf-8")
        log.write(header)
        log.flush()
        try:
            proc = subprocess.Popen(
                command,
                # Lines arrive as printed (silence is silence), tracebacks without colour codes:
                # a Jupyter kernel sets FORCE_COLOR, which Python 3.13 obeys even into a pipe.
                env={**env, "PYTHONUNBUFFERED": "1", "PYTHON_COLORS": "0"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: Ctrl-C is ours to forward
                preexec_fn=self._preexec,
            )
        except OSError as error:
            log.close()
            raise UsageError(f"cannot start {command[0]!r}: {error}; check the command") from None
        self.procs.append(proc)
        self.labels.append(label)
        self._logs.append(log)

    def start_pumps(self) -> None:
        """Starts copying every task's output; call once, after the last `spawn`."""
        # Threads only after every fork: preexec_fn is unsafe while other threads run.
        for proc, log, label in zip(self.procs, self._logs, self.labels, strict=True):
            thread = threading.Thread(target=self._pump, args=(proc, log, label), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, proc: subprocess.Popen, log: TextIO, label: str) -> None:
        with log:
            for raw in iter(proc.stdout.readline, b""):
                self.last_output = time.monotonic()
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                log.write(line + "\n")
                log.flush()
                if not _RUNTIME_LOG.match(line):
                    self.write(label, line)
            proc.stdout.close()

    def join(self, index: int | None = None) -> None:
        """Waits (briefly) for the pumps to copy the last lines of task `index`, or of all."""
        # A grandchild that escaped the group could hold the pipe open; do not wait on it.
        for thread in self._threads if index is None else self._threads[index : index + 1]:
            thread.join(timeout=_GRACE_S)

    def stop(self) -> None:
        """SIGTERM every task's process group, then SIGKILL what is left a few seconds later."""
        procs = self.procs
        _signal_groups([p for p in procs if p.poll() is None], signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        _signal_groups(procs, signal.SIGKILL)
        for proc in procs:
            proc.wait()

    def _release(self) -> None:
        """Reaps every task, and closes the pipes and logs no pump took over."""
        if not self._threads:  # a start that failed half-way: nothing was pumped
            for proc, log in zip(self.procs, self._logs, strict=True):
                proc.stdout.close()
                log.close()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_GRACE_S)

    def write(self, label: str, line: str) -> None:
        """Writes `[label] line` to the job's stream, whole lines; a failing stream stops no job."""
        # The logs keep every line: an unencodable character is escaped; once the stream's
        # reader is gone (`... | head`), it gets no more.
        text = f"[{label}] {line}\n"
        with self.lock:
            if self.stream is None:
                return
            try:
                try:
                    self.stream.write(text)
                except UnicodeEncodeError:
                    self.stream.write(text.encode("ascii", "backslashreplace").decode("ascii"))
                self.stream.flush()
            except OSError:
                self.stream = None

    def say(self, message: str) -> None:
        """A line from the launcher itself, `[launch] message`."""
        self.write("launch", message)

    def run(self, body: Callable[[], int], noun: str | None = None) -> int:
        """Returns `body()`, or 130 on Ctrl-C and 143 on SIGTERM after stopping the tasks."""
        # SIGTERM (from kill, Slurm, docker stop) must stop the tasks too, not just end us:
        # its handler raises SystemExit in the main thread, the only one that may set it.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)) if main else None
        try:
            return body()
        except (KeyboardInterrupt, SystemExit) as stopped:
            ctrl_c = isinstance(stopped, KeyboardInterrupt)
            if noun:
                self.say(f"{'interrupted' if ctrl_c else 'terminated'}; stopping all {noun}")
            self.stop()
            return 130 if ctrl_c else 143
        finally:  # whatever happened, nothing of ours outlives us; a half start included
            if main:
                signal.signal(signal.SIGTERM, previous)
            _signal_groups(self.procs, signal.SIGKILL)
            self._release()
