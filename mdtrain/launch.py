"""Local multi-worker launcher for `tf.distribute.MultiWorkerMirroredStrategy`.

Starts N worker processes on one machine, each with its own `TF_CONFIG`, so the
same `mdtrain train --strategy multiworker` that runs on a cluster can be tried
and taught on a laptop. Output is prefixed with `[worker i] ` and kept in
per-worker log files; a crashed worker stops the others and, if asked, the whole
group is restarted; a hang is reported instead of waited on forever.

Exit codes of `run_workers` and `launch`: the chief's (worker 0's) status when
every worker ends on its own; the failing worker's status when a worker fails and
no restarts are left (exit code 2, a usage error, is never restarted); 124 when
workers appear stuck; 130 on Ctrl-C; 143 on SIGTERM. A process killed by signal N
counts as 128 + N, as in a shell.

Security: TensorFlow's gRPC servers are unauthenticated and unencrypted; anyone
who can reach a worker's port can join or disrupt the job. The launcher puts only
127.0.0.1 addresses in `TF_CONFIG` unless `host` is given explicitly, so workers
talk over loopback; but TensorFlow's server *listens* on every interface of the
port (it ignores the host; checked with `ss -ltn` under TF 2.21). On a machine
reachable from an untrusted network, firewall the ports or run the workers in a
network namespace or container without outside access.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from mdtrain.errors import UsageError
from mdtrain.gpus import assign_gpus, visible_gpus

HANG_EXIT_CODE = 124
USAGE_EXIT_CODE = 2
_GRACE_S = 5.0  # between SIGTERM and SIGKILL: long enough to flush logs, short enough to wait
_POLL_S = 0.1


class _Terminated(Exception):  # raised in the main thread when the launcher gets SIGTERM
    pass


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `n` distinct TCP ports that are free on `host` right now.

    The sockets are held open together, so the ports are distinct, then closed
    for the workers to bind; a port taken in between fails one attempt, and a
    restart takes fresh ports.

    Args:
        n: How many ports to return.
        host: The address to bind. Defaults to `"127.0.0.1"`.

    Returns:
        A list of `n` distinct port numbers.

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = [socket.socket(family, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(worker_addresses: list[str], index: int) -> dict:
    """Builds the `TF_CONFIG` dictionary of one worker.

    Worker 0 is the chief: MultiWorkerMirroredStrategy makes it the one that
    saves checkpoints and writes summaries.

    Args:
        worker_addresses: `"host:port"` of every worker, in index order.
        index: The index of the worker this config is for.

    Returns:
        `{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": index}}`,
        for `json.dumps` into the `TF_CONFIG` environment variable.

    Raises:
        UsageError: If `index` is not a valid position in `worker_addresses`.

    Example:
        >>> tf_config(["127.0.0.1:2222", "127.0.0.1:2223"], 1)["task"]
        {'type': 'worker', 'index': 1}
    """
    if not 0 <= index < len(worker_addresses):
        raise UsageError(f"worker index {index} is outside 0..{len(worker_addresses) - 1}")
    return {
        "cluster": {"worker": list(worker_addresses)},
        "task": {"type": "worker", "index": index},
    }


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _child_setup():
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
    for proc in procs:
        try:
            os.killpg(proc.pid, sig)  # the whole group: workers may have children of their own
        except (ProcessLookupError, PermissionError):
            pass


def _stop(procs: list[subprocess.Popen], grace_s: float = _GRACE_S) -> None:
    """SIGTERM every worker's process group, then SIGKILL what is left after `grace_s`."""
    _signal_groups([p for p in procs if p.poll() is None], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    _signal_groups(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turns SIGTERM into `_Terminated` while the block runs (main thread only)."""
    # SIGTERM (from kill, Slurm, docker stop) must stop the tasks too, not just end us.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# TensorFlow's C++ runtime logs in glog's format ("E0000 00:00:1795393443.609882  30925
# base_collective_executor.cc:252] ..."), absl announces where it logs, and gRPC
# continues some errors on lines of their own. A task that loses a peer (a crash drill,
# the chief exiting first) prints a dozen of them; they go to the task's log file, not to
# the job's stream.
_RUNTIME_LOG = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\]|:UNKNOWN:"
    r"|WARNING: All log messages before absl::InitializeLog|Additional GRPC error information"
)


class _Tasks:
    """Processes started together, each in its own process group with its own log file.

    One pump thread per task copies its output to the log and, prefixed with the
    task's label and without TensorFlow's runtime log lines, to the job's stream;
    `last_output` is when any task last printed.
    """

    def __init__(self, job: _Job):
        self.job = job
        self.procs: list[subprocess.Popen] = []
        self.labels: list[str] = []
        self.last_output = time.monotonic()
        self._logs: list[TextIO] = []
        self._threads: list[threading.Thread] = []
        self._preexec = _child_setup()

    def spawn(self, command: list[str], env: dict[str, str], label: str, header: str = "") -> None:
        log = open(self.job.log_dir / f"{label.replace(' ', '-')}.log", "a", encoding="utf-8")
        log.write(header)
        log.flush()
        try:
            proc = subprocess.Popen(
                command,
                env={**env, "PYTHONUNBUFFERED": "1"},  # lines arrive as printed: silence is silence
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
                    self.job.write(label, line)
            proc.stdout.close()

    def join(self) -> None:
        # A grandchild that escaped the group could hold the pipe open; do not wait on it.
        for thread in self._threads:
            thread.join(timeout=_GRACE_S)


class _Job:
    """One launch: its log folder, its shared stream, and the tasks it runs now."""

    def __init__(self, log_dir: str | os.PathLike | None, stream: TextIO | None):
        fresh = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="mdtrain-") if fresh else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stream = sys.stdout if stream is None else stream  # a notebook's, if it is one
        self.lock = threading.Lock()
        self.tasks = _Tasks(self)

    def write(self, label: str, line: str) -> None:
        with self.lock:
            self.stream.write(f"[{label}] {line}\n")
            self.stream.flush()

    def say(self, message: str) -> None:
        self.write("launch", message)

    def new_tasks(self) -> _Tasks:
        self.tasks = _Tasks(self)
        return self.tasks

    def run(self, body: Callable[[], int], noun: str | None = None) -> int:
        """Returns `body()`, or 130 on Ctrl-C and 143 on SIGTERM after stopping the tasks.

        With `noun` ("workers") it says what it stops.
        """
        with _sigterm_raises():
            try:
                return body()
            except KeyboardInterrupt:
                return self._stop_all("interrupted", noun, 130)
            except _Terminated:
                return self._stop_all("terminated", noun, 143)
            finally:  # whatever happened, nothing of ours outlives us; a half start included
                _signal_groups(self.tasks.procs, signal.SIGKILL)

    def _stop_all(self, why: str, noun: str | None, status: int) -> int:
        if noun:
            self.say(f"{why}; stopping all {noun}")
        _stop(self.tasks.procs)
        return status


def _check_worker_args(command: list[str], num_workers: int, restarts: int, hang_timeout_s) -> None:
    if not command:
        raise UsageError("empty worker command; pass the program to run, e.g. ['python', 'x.py']")
    if num_workers < 1:
        raise UsageError(f"--workers {num_workers}: pass 1 or more workers")
    if restarts < 0:
        raise UsageError(f"--restarts {restarts}: pass 0 or more restarts")
    if hang_timeout_s is not None and hang_timeout_s <= 0:
        raise UsageError(f"hang timeout {hang_timeout_s}: pass a positive number of seconds")


@dataclasses.dataclass(frozen=True)
class _Workers:
    """What every attempt of `run_workers` starts: `command` as `num` workers on `host`."""

    command: list[str]
    num: int
    host: str
    env: dict[str, str]
    gpus: list[str] | None

    def attempts(self, job: _Job, restarts: int, hang_timeout_s: float | None) -> int:
        """Starts the workers until an attempt ends the job; returns its exit status."""
        for number in range(1, restarts + 2):
            tasks = self.start(job, number)
            status = _watch(tasks, number, restarts, hang_timeout_s, job.say)
            tasks.join()
            if status is not None:
                return status
        raise AssertionError("unreachable: the last attempt always returns")

    def start(self, job: _Job, attempt: int) -> _Tasks:
        addresses = [_address(self.host, port) for port in free_ports(self.num, self.host)]
        job.say(f"attempt {attempt}: " + " ".join(addresses))
        tasks = job.new_tasks()
        header = f"=== attempt {attempt} ({time.strftime('%Y-%m-%d %H:%M:%S')}) ===\n"
        for i in range(self.num):
            tasks.spawn(self.command, self._env(addresses, i, attempt), f"worker {i}", header)
        tasks.start_pumps()
        return tasks

    def _env(self, addresses: list[str], index: int, attempt: int) -> dict[str, str]:
        env = dict(self.env)
        env.update(
            TF_CONFIG=json.dumps(tf_config(addresses, index)),
            MDTRAIN_WORKER_INDEX=str(index),
            MDTRAIN_ATTEMPT=str(attempt),
        )
        if self.gpus is not None:  # this worker's own GPUs, from mdtrain.gpus.assign_gpus
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[index]
        return env


def run_workers(
    command: list[str],
    num_workers: int,
    *,
    restarts: int = 0,
    host: str = "127.0.0.1",
    log_dir: str | os.PathLike | None = None,
    hang_timeout_s: float | None = 120.0,
    env: dict[str, str] | None = None,
    stream: TextIO | None = None,
    gpus_per_worker: int | None = None,
) -> int:
    """Runs `command` as `num_workers` cooperating workers and waits for them.

    Each worker gets a free port on `host`, its own `TF_CONFIG` (worker 0 is the
    chief), `MDTRAIN_WORKER_INDEX` and `MDTRAIN_ATTEMPT` (1, 2, ...). Output lines
    go to `stream` as `[worker i] ...` and are appended to `log_dir/worker-i.log`
    under a `=== attempt k ===` header. A worker that exits non-zero stops the
    others; while restarts are left all start again on fresh ports, and resuming
    is the command's job (`--backup-dir`). See the module docstring for exit
    codes and why `host` must stay on loopback or a trusted network.

    Args:
        command: The program and its arguments that every worker runs.
        num_workers: How many workers to start. Must be at least 1.
        restarts: How many times to restart all workers after one fails.
            Defaults to `0`.
        host: The address workers bind and reach each other on.
            Defaults to `"127.0.0.1"`.
        log_dir: Where per-worker logs go. Defaults to `None`, a fresh
            temporary folder whose path is printed at the start.
        hang_timeout_s: Seconds after which workers count as stuck, when one
            has finished and others have not, or none has printed anything.
            `None` disables the check. Defaults to `120.0`.
        env: Environment for the workers. Defaults to `None`, this process's.
        stream: Where prefixed output and launcher messages go.
            Defaults to `None`, the `sys.stdout` of the moment (a notebook's too).
        gpus_per_worker: GPUs for each worker, set in its `CUDA_VISIBLE_DEVICES`
            (`mdtrain.gpus.assign_gpus`); `0` runs the workers on the CPU.
            Defaults to `None`: the visible GPUs split evenly, none on a CPU machine.

    Returns:
        The exit status described in the module docstring: the chief's status,
        the failing worker's once restarts are spent, 124 for stuck workers,
        130 on Ctrl-C, 143 on SIGTERM.

    Raises:
        UsageError: If `command` is empty or cannot be started, `num_workers < 1`,
            `restarts < 0`, `hang_timeout_s <= 0`, or too few GPUs.

    Example:
        >>> run_workers([sys.executable, "train.py"], 2, restarts=1)  # doctest: +SKIP
    """
    _check_worker_args(command, num_workers, restarts, hang_timeout_s)
    gpus = assign_gpus(visible_gpus(env), num_workers, gpus_per_worker)
    job = _Job(log_dir, stream)
    job.say(f"{num_workers} workers on {host}; logs in {job.log_dir}")
    if gpus is not None:
        shares = (f"worker {i}: {g or '(none)'}" for i, g in enumerate(gpus))
        job.say("CUDA_VISIBLE_DEVICES " + "; ".join(shares))
    workers = _Workers(command, num_workers, host, dict(os.environ if env is None else env), gpus)
    return job.run(lambda: workers.attempts(job, restarts, hang_timeout_s), noun="workers")


def _watch(tasks: _Tasks, number: int, restarts: int, hang_timeout_s, say) -> int | None:
    """Waits for one attempt; returns its exit status, or None to restart."""
    procs = tasks.procs
    first_done = None
    while True:
        codes = [p.poll() for p in procs]
        now = time.monotonic()
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        # Once the chief has finished cleanly the job's result is saved: later failures are noise.
        if failed and codes[0] != 0:
            return _after_failure(procs, failed, number, restarts, say)
        running = [i for i, c in enumerate(codes) if c is None]
        if not running:
            if failed:
                index, code = failed[0]
                say(f"worker {index} exited with code {code} after the chief finished")
            return _exit_status(codes[0])
        if first_done is None and len(running) < len(procs):
            first_done = now
        why = _why_stuck(tasks, running, first_done, now, hang_timeout_s)
        if why:
            stuck = ", ".join(map(str, running))
            say(
                f"workers {stuck} appear stuck (probably waiting in a collective for a "
                f"worker that is gone): {why}; stopping all; exit code {HANG_EXIT_CODE}"
            )
            _stop(procs)
            return HANG_EXIT_CODE
        time.sleep(_POLL_S)


def _after_failure(procs, failed, number: int, restarts: int, say) -> int | None:
    """Stops the workers after `failed`; returns the exit status, or None to restart."""
    # Exit code 2 is a usage error (argparse, mdtrain's CLI): a restart would repeat it.
    usage = any(c == USAGE_EXIT_CODE for _, c in failed)
    left = number <= restarts and not usage
    plan = f"restart {number} of {restarts}" if left else "no restarts left"
    plan = "bad input, not restarting" if usage and number <= restarts else plan
    what = ", ".join(f"worker {i} exited with code {c}" for i, c in failed)
    say(f"{what}; stopping the others; {plan}")
    _stop(procs)
    # The chief's own failure if it failed, else the worker's: not our SIGTERM to the chief.
    return None if left else _exit_status(failed[0][1])


def _why_stuck(tasks: _Tasks, running, first_done, now: float, hang_timeout_s) -> str | None:
    if hang_timeout_s is None:
        return None
    if first_done is not None and now - first_done > hang_timeout_s:
        done = [i for i in range(len(tasks.procs)) if i not in running]
        return f"worker {done[0]} finished {now - first_done:.0f}s ago"
    if now - tasks.last_output > hang_timeout_s:
        return f"no output for {now - tasks.last_output:.0f}s"
    return None


def kill_worker_when(pattern: str | os.PathLike, index: int, timeout_s: float = 600.0):
    """Kills worker `index` with SIGKILL once a file matching `pattern` exists (a fault drill).

    For demonstrating and testing `--restarts` with `--backup-dir`: call it just
    before `launch` or `run_workers` in the same process, with e.g.
    `"backup/ckpt-*"`, so a worker dies right after the first backup.

    Args:
        pattern: a glob pattern, absolute or relative to the current folder.
        index: the worker to kill (its `MDTRAIN_WORKER_INDEX`).
        timeout_s: give up after this many seconds. Defaults to `600.0`.

    Returns:
        The watching daemon thread.
    """
    import glob

    import psutil

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not glob.glob(str(pattern)):
            time.sleep(_POLL_S)
        for child in psutil.Process().children():
            try:
                if child.environ().get("MDTRAIN_WORKER_INDEX") == str(index):
                    child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _strategy_arg(train_args: list[str]) -> str | None:
    for i, arg in enumerate(train_args):
        if arg == "--strategy":
            return train_args[i + 1] if i + 1 < len(train_args) else ""
        if arg.startswith("--strategy="):
            return arg.split("=", 1)[1]
    return None


def launch(
    num_workers: int, train_args: list[str], *, restarts: int = 0, num_ps: int = 0, **kwargs
) -> int:
    """Runs `mdtrain train --strategy multiworker` as `num_workers` local workers.

    The CLI's `mdtrain launch --workers N [--restarts R] -- <train arguments>`.
    With restarts, pass `--backup-dir DIR` in `train_args` so a restarted run
    resumes instead of starting over. With `num_ps` (`--ps M`) it runs
    parameter-server training instead (`launch_ps`).

    Args:
        num_workers: How many workers to start. Must be at least 1.
        train_args: Arguments for `mdtrain train`; `--strategy multiworker`
            is added unless already there.
        restarts: How many times to restart all workers after one fails.
            Defaults to `0`.
        num_ps: Parameter servers; more than 0 runs `launch_ps`. Defaults to `0`.
        **kwargs: Passed to `run_workers` (`host`, `log_dir`,
            `hang_timeout_s`, `env`, `stream`).

    Returns:
        The exit status of `run_workers`.

    Raises:
        UsageError: If `train_args` asks for another strategy, or for the
            reasons `run_workers` gives.

    Example:
        >>> launch(2, ["--epochs", "2", "--backup-dir", "/tmp/bk"], restarts=1)  # doctest: +SKIP
    """
    if num_ps:
        if restarts:
            raise UsageError("--restarts with --ps: a parameter-server job outlives a lost worker; "
                             "drop --restarts")  # fmt: skip
        return launch_ps(num_workers, num_ps, train_args, **kwargs)
    strategy = _strategy_arg(train_args)
    command = [sys.executable, "-m", "mdtrain", "train", *train_args]
    if strategy is None:
        command += ["--strategy", "multiworker"]
    elif strategy != "multiworker":
        raise UsageError(
            f"--strategy {strategy}: launch runs multi-worker training; "
            "drop --strategy or pass --strategy multiworker"
        )
    return run_workers(command, num_workers, restarts=restarts, **kwargs)


# Parameter-server jobs: roles `ps`, `worker` and `chief` (`mdtrain launch --ps M`).


def cluster_tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> dict:
    """Builds the `TF_CONFIG` dictionary of one task of a cluster with roles.

    Args:
        cluster: `{"chief": [...], "worker": [...], "ps": [...]}`, `"host:port"` each.
        task_type: the role of this task, a key of `cluster`.
        index: its position in `cluster[task_type]`.

    Returns:
        `{"cluster": cluster, "task": {"type": task_type, "index": index}}`.

    Raises:
        UsageError: If `task_type` or `index` is not in `cluster`.

    Example:
        >>> cluster_tf_config({"chief": ["h:1"], "ps": ["h:2"]}, "ps", 0)["task"]
        {'type': 'ps', 'index': 0}
    """
    if not 0 <= index < len(cluster.get(task_type, [])):
        raise UsageError(f"no task {task_type} {index} in the cluster {sorted(cluster)}")
    return {
        "cluster": {role: list(addresses) for role, addresses in cluster.items()},
        "task": {"type": task_type, "index": index},
    }


def ps_cluster(num_workers: int, num_ps: int, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """A chief, `num_workers` workers and `num_ps` parameter servers on free ports of `host`."""
    ports = free_ports(1 + num_workers + num_ps, host)
    addresses = [_address(host, p) for p in ports]
    return {
        "chief": addresses[:1],
        "worker": addresses[1 : 1 + num_workers],
        "ps": addresses[1 + num_workers :],
    }


def run_ps_cluster(
    chief_command: list[str],
    server_command: list[str],
    num_workers: int,
    num_ps: int,
    *,
    host: str = "127.0.0.1",
    log_dir: str | os.PathLike | None = None,
    hang_timeout_s: float | None = 300.0,
    env: dict[str, str] | None = None,
    stream: TextIO | None = None,
    gpus_per_worker: int | None = None,
) -> int:
    """Runs a parameter-server job: `num_ps` servers, `num_workers` workers and a chief.

    Every task gets `TF_CONFIG` with its role (`ps`, `worker`, `chief`) and
    `MDTRAIN_ROLE`; workers also get `MDTRAIN_WORKER_INDEX` (for
    `kill_worker_when`). Parameter servers and workers run `server_command`
    and never end on their own; the chief runs `chief_command`, and the job
    ends with it. Unlike `run_workers`, a worker that dies does not stop the
    job: the chief's coordinator runs its steps on the other workers. A
    parameter server that dies ends the job (it held variables). Output goes
    to `stream` as `[ps i] ...`, `[worker i] ...`, `[chief] ...`.

    Args:
        chief_command: what the chief runs (the training).
        server_command: what every ps and worker runs (a server).
        num_workers: workers, at least 1.
        num_ps: parameter servers, at least 1.
        host: the address the tasks use. Defaults to `"127.0.0.1"`.
        log_dir: per-task logs. Defaults to None: a fresh temporary folder.
        hang_timeout_s: stop everything after this many seconds without
            output from any task. Defaults to `300.0`.
        env: environment for the tasks. Defaults to None: this process's.
        stream: where output goes. Defaults to None: `sys.stdout`.
        gpus_per_worker: GPUs of each worker, as in `run_workers`; the ps and
            the chief get none. Defaults to None: the visible GPUs split evenly.

    Returns:
        The chief's exit status; a dead ps's; 124 when stuck; 130 on Ctrl-C.

    Raises:
        UsageError: for fewer than 1 worker or ps, or a command that cannot start.

    Example:
        >>> run_ps_cluster(["python", "chief.py"], ["python", "serve.py"], 2, 1)  # doctest: +SKIP
    """
    if num_workers < 1 or num_ps < 1:
        raise UsageError(f"--workers {num_workers} --ps {num_ps}: pass at least 1 of each")
    job = _Job(log_dir, stream)
    gpus = assign_gpus(visible_gpus(env), num_workers, gpus_per_worker)
    cluster = ps_cluster(num_workers, num_ps, host)
    job.say(f"{num_ps} ps, {num_workers} workers and a chief on {host}; logs in {job.log_dir}")
    base_env = dict(os.environ if env is None else env)

    def start_and_watch() -> int:
        tasks = job.new_tasks()
        for role, index in _ps_roles(num_ps, num_workers):
            command = chief_command if role == "chief" else server_command
            task_env = _ps_task_env(base_env, cluster, role, index, gpus)
            tasks.spawn(command, task_env, "chief" if role == "chief" else f"{role} {index}")
        tasks.start_pumps()
        return _watch_ps(tasks, num_ps, hang_timeout_s, job.say)

    return job.run(start_and_watch)


def _ps_roles(num_ps: int, num_workers: int) -> list[tuple[str, int]]:
    roles = [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(num_workers)]
    return [*roles, ("chief", 0)]  # last: the watcher finds the chief at procs[-1]


def _ps_task_env(base_env, cluster, role: str, index: int, gpus) -> dict[str, str]:
    env = dict(base_env)
    env.update(TF_CONFIG=json.dumps(cluster_tf_config(cluster, role, index)), MDTRAIN_ROLE=role)
    if role == "worker":
        env["MDTRAIN_WORKER_INDEX"] = str(index)
    if gpus is not None:  # workers compute; the ps and the chief only hold and schedule
        env["CUDA_VISIBLE_DEVICES"] = gpus[index] if role == "worker" else ""
    return env


def _watch_ps(tasks: _Tasks, num_ps: int, hang_timeout_s, say) -> int:
    """Waits for the chief; stops the servers then. Returns the job's exit status."""
    procs, labels = tasks.procs, tasks.labels
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        if codes[-1] is not None:
            say(f"the chief exited with code {codes[-1]}; stopping the servers")
            _stop(procs)
            return _exit_status(codes[-1])
        for i, code in enumerate(codes[:-1]):
            if code is None or i in reported:
                continue
            reported.add(i)
            if i < num_ps:
                say(f"{labels[i]} exited with code {code}: its variables are lost; stopping all")
                _stop(procs)
                return _exit_status(code) or 1
            say(f"{labels[i]} exited with code {code}; the chief reruns its steps on the others")
        if hang_timeout_s is not None and time.monotonic() - tasks.last_output > hang_timeout_s:
            say(f"no output for {hang_timeout_s:.0f}s: stuck; stopping all; exit code "
                f"{HANG_EXIT_CODE}")  # fmt: skip
            _stop(procs)
            return HANG_EXIT_CODE
        time.sleep(_POLL_S)


def launch_ps(num_workers: int, num_ps: int, train_args: list[str], **kwargs) -> int:
    """Runs parameter-server training of `mdtrain train` arguments as a local cluster.

    The CLI's `mdtrain launch --workers N --ps M -- <train arguments>`: the
    chief runs `python -m mdtrain.ps chief <train arguments>`, every ps and
    worker `python -m mdtrain.ps serve`.

    Args:
        num_workers: workers, at least 1.
        num_ps: parameter servers, at least 1.
        train_args: `mdtrain train` arguments (plus `mdtrain.ps`'s `--log-every`).
        **kwargs: passed to `run_ps_cluster` (`host`, `log_dir`,
            `hang_timeout_s`, `env`, `stream`).

    Returns:
        The exit status of `run_ps_cluster`.

    Raises:
        UsageError: if `train_args` asks for a strategy other than `ps`.
    """
    strategy = _strategy_arg(train_args)
    if strategy not in (None, "ps"):
        raise UsageError(f"--strategy {strategy}: launch --ps runs parameter-server training; "
                         "drop --strategy")  # fmt: skip
    if strategy is not None:  # `ps` is what the chief runs anyway
        at = next(i for i, a in enumerate(train_args) if a.startswith("--strategy"))
        train_args = train_args[:at] + train_args[at + (1 if "=" in train_args[at] else 2) :]
    chief = [sys.executable, "-m", "mdtrain.ps", "chief", *train_args]
    server = [sys.executable, "-m", "mdtrain.ps", "serve"]
    return run_ps_cluster(chief, server, num_workers, num_ps, **kwargs)
