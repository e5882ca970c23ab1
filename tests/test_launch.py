"""Tests for mdtrain.launcher, with a fake worker script (no TensorFlow) except one slow test."""

import faulthandler
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import mdtrain.launcher as launch_mod
from mdtrain.errors import UsageError
from mdtrain.gpus import visible_gpus
from mdtrain.launcher import (
    free_ports,
    launch,
    run_workers,
    tf_config,
    worker_devices,
)
from mdtrain_course.drills import kill_worker_when

FAKE = [sys.executable, str(Path(__file__).parent / "fixtures" / "fake_worker.py")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _time_limit(request):
    # No pytest-timeout here: a hung launcher would hang CI, so dump stacks and exit instead.
    faulthandler.dump_traceback_later(
        300 if request.node.get_closest_marker("slow") else 60, exit=True
    )
    yield
    faulthandler.cancel_dump_traceback_later()


def _env(**fake):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in fake.items()})
    return env


def _run(num_workers, tmp_path, **kwargs):
    stream = io.StringIO()
    kwargs.setdefault("log_dir", tmp_path / "logs")
    code = run_workers(FAKE, num_workers, stream=stream, **kwargs)
    return code, stream.getvalue()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(folder: Path, n: int, timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [folder / f"worker-{i}.pid" for i in range(n)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"workers did not start within {timeout_s}s")


def _kill_leftovers(folder: Path) -> None:
    # Only after a failure can workers remain; do not leave them to the next test.
    for pid_file in folder.glob("worker-*.pid"):
        pid = int(pid_file.read_text() or 0)
        if pid and _alive(pid) and "fake_worker" in " ".join(psutil.Process(pid).cmdline()):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_tf_config_shape():
    addresses = ["127.0.0.1:1111", "127.0.0.1:2222"]
    assert tf_config(addresses, 1) == {
        "cluster": {"worker": addresses},
        "task": {"type": "worker", "index": 1},
    }
    with pytest.raises(UsageError):
        tf_config(addresses, 2)


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((FAKE, 0), {}),
        ((FAKE, 2), {"restarts": -1}),
        (([], 2), {}),
        ((FAKE, 2), {"hang_timeout_s": 0}),
        ((["/nonexistent/worker"], 1), {}),
    ],
)
def test_bad_input_raises_usage_error(args, kwargs):
    with pytest.raises(UsageError):
        run_workers(*args, **kwargs)


def test_launch_adds_multiworker_strategy(monkeypatch):
    seen = []
    monkeypatch.setattr(
        launch_mod.jobs, "run_workers", lambda cmd, n, **kw: seen.append((cmd, n, kw)) or 0
    )
    assert launch(2, ["--epochs", "1"], restarts=1, log_dir="x") == 0
    cmd, n, kw = seen[0]
    assert cmd == [
        sys.executable,
        "-m",
        "mdtrain",
        "train",
        "--epochs",
        "1",
        "--strategy",
        "multiworker",
    ]
    assert (n, kw) == (2, {"restarts": 1, "log_dir": "x"})
    launch(2, ["--strategy=multiworker", "--epochs", "1"])
    assert seen[1][0][-4:] == ["--epochs", "1", "--strategy", "multiworker"]
    with pytest.raises(UsageError, match="--strategy mirrored"):  # argparse keeps the last
        launch(2, ["--strategy", "multiworker", "--strategy", "mirrored"])
    with pytest.raises(UsageError, match="multiworker"):
        launch(2, ["--strategy", "mirrored"])


def test_streams_prefixed_lines_writes_logs_and_tf_config(tmp_path):
    code, out = _run(3, tmp_path)
    assert code == 0
    clusters = set()
    for i in range(3):
        assert f"[worker {i}] index={i} attempt=1" in out
        assert f"[worker {i}] stderr line from {i}" in out
        clusters.add(re.search(rf"\[worker {i}\] cluster=(.*)", out).group(1))
        log = (tmp_path / "logs" / f"worker-{i}.log").read_text()
        assert log.startswith("=== attempt 1") and f"index={i}" in log and "[worker" not in log
    assert len(clusters) == 1  # every worker sees the same cluster
    workers = json.loads(clusters.pop())
    assert len({w.rsplit(":", 1)[1] for w in workers}) == 3
    assert all(w.startswith("127.0.0.1:") for w in workers)
    assert f"logs in {tmp_path / 'logs'}" in out
    # A second run appends: nothing of the first is lost.
    assert _run(3, tmp_path)[0] == 0
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert log.count("=== attempt 1") == 2 and log.count("index=0") == 2


def test_tensorflows_runtime_log_lines_go_to_the_log_file_only(tmp_path):
    code, out = _run(2, tmp_path)
    assert code == 0
    assert "StartAbort" not in out and "Error received from peer" not in out
    assert "Additional GRPC error information" not in out
    assert "[worker 1] worker 1 done" in out  # the worker's own lines still show
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "StartAbort" in log and "Error received from peer" in log


def test_a_workers_traceback_reaches_its_log_without_colour_codes(tmp_path):
    # A Jupyter kernel sets FORCE_COLOR; Python 3.13 would then colour tracebacks into the log.
    crash = "import os; print('colours', os.environ['PYTHON_COLORS']); raise RuntimeError('boom')"
    stream = io.StringIO()
    code = run_workers([sys.executable, "-c", crash], 1, stream=stream, log_dir=tmp_path,
                       env=_env(FORCE_COLOR="1"))  # fmt: skip
    log = (tmp_path / "worker-0.log").read_text()
    assert code == 1 and "colours 0" in log
    assert "\nRuntimeError: boom" in log and "\x1b[" not in log + stream.getvalue()


def test_default_log_dir_is_fresh_temp_dir(tmp_path):
    code, out = run_workers(FAKE, 1, stream=(s := io.StringIO())), None
    out = s.getvalue()
    folder = Path(re.search(r"logs in (\S+)", out).group(1))
    assert code == 0 and (folder / "worker-0.log").exists()


def test_workers_are_told_how_often_to_show_life(tmp_path):
    code, out = _run(2, tmp_path, hang_timeout_s=40.0)
    assert code == 0 and "[worker 1] index=1 attempt=1 heartbeat=10" in out  # mdtrain.heartbeat
    code, out = _run(1, tmp_path, hang_timeout_s=None)
    assert code == 0 and "heartbeat=None" in out


def test_a_closed_output_stream_stops_neither_the_job_nor_its_logs(tmp_path):
    class ClosedAfterThreeLines(io.StringIO):  # as `mdtrain launch ... | head -3`
        def write(self, text):
            if self.getvalue().count("\n") >= 3:
                raise BrokenPipeError(32, "Broken pipe")
            return super().write(text)

    stream = ClosedAfterThreeLines()
    code = run_workers(FAKE, 2, stream=stream, log_dir=tmp_path / "logs")
    assert code == 0 and stream.getvalue().count("\n") == 3
    for i in (0, 1):
        assert f"worker {i} done" in (tmp_path / "logs" / f"worker-{i}.log").read_text()


def test_a_line_the_stream_cannot_encode_is_escaped(tmp_path):
    class AsciiOnly(io.StringIO):
        def write(self, text):
            text.encode("ascii")
            return super().write(text)

    stream = AsciiOnly()
    cafe = [sys.executable, "-c", "print('caf\\xe9')"]  # a UTF-8 line from the worker
    assert run_workers(cafe, 1, log_dir=tmp_path, stream=stream) == 0
    assert "[worker 0] caf\\xe9\n" in stream.getvalue()
    assert "café" in (tmp_path / "worker-0.log").read_text(encoding="utf-8")


def test_returns_chief_status(tmp_path):
    code, out = _run(2, tmp_path, env=_env(FAKE_EXIT="0:3"))
    assert code == 3
    assert "worker 0 exited with code 3; stopping the others; no restarts left" in out


def test_usage_error_exit_is_not_restarted(tmp_path):
    code, out = _run(2, tmp_path, env=_env(FAKE_EXIT="0:2,1:2"), restarts=1)
    assert code == 2 and "bad input, not restarting" in out and "attempt 2" not in out


def test_crash_without_restarts_fails(tmp_path):
    env = _env(FAKE_CRASH=f"1:{tmp_path}", FAKE_SLEEP="0:30")
    start = time.monotonic()
    code, out = _run(2, tmp_path, env=env)
    assert code == 128 + 9
    assert "worker 1 exited with code -9; stopping the others; no restarts left" in out
    assert time.monotonic() - start < 15  # the sleeping chief was stopped, not waited for


def test_crash_on_first_attempt_is_restarted(tmp_path):
    # Worker 0 outlives worker 1's crash even if worker 1 starts seconds late.
    env = _env(FAKE_CRASH=f"1:{tmp_path}", FAKE_SLEEP="0:5")
    code, out = _run(2, tmp_path, env=env, restarts=1)
    assert code == 0, out
    assert "worker 1 exited with code -9; stopping the others; restart 1 of 1" in out
    assert "[worker 1] index=1 attempt=2" in out and "[worker 0] worker 0 done" in out
    ports = re.findall(r"attempt \d: (.*)", out)
    assert len(ports) == 2  # fresh addresses for the second attempt
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "=== attempt 1" in log and "=== attempt 2" in log


def test_hang_after_one_worker_finishes_is_reported(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    env = _env(FAKE_SLEEP="1:inf", FAKE_PIDS=pids)
    start = time.monotonic()
    code, out = _run(2, tmp_path, env=env, hang_timeout_s=3.0)  # 3 s: both start and print
    assert code == 124
    assert "workers 1 appear stuck (probably waiting in a collective" in out
    assert time.monotonic() - start < 15
    assert _wait_gone(_pids(pids, 2)) == []


def test_silence_is_reported_as_hang(tmp_path):
    code, out = _run(2, tmp_path, env=_env(FAKE_SLEEP="0:inf,1:inf"), hang_timeout_s=1.0)
    assert code == 124 and "workers 0, 1 appear stuck" in out and "no output" in out


def _start_launcher(tmp_path, pids, pdeathsig=True):
    # SIGINT may be ignored when tests run in a background job; restore Python's handler.
    # Without pdeathsig, only the launcher's own clean-up can stop the workers.
    script = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import mdtrain.launcher.processes
        from mdtrain.launcher import run_workers
        if not {pdeathsig!r}:
            mdtrain.launcher.processes.child_setup = lambda: None
        sys.exit(run_workers({FAKE!r}, 2, log_dir={str(tmp_path / "logs")!r}))
    """)
    env = _env(FAKE_SLEEP="0:inf,1:inf", FAKE_PIDS=pids, PYTHONPATH=ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so the test's own signals stay with this launcher
    )


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_all_workers(tmp_path, sig, expected):
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = _start_launcher(tmp_path, pids, pdeathsig=False)
    try:
        workers = _pids(pids, 2)
        launcher.send_signal(sig)
        out, _ = launcher.communicate(timeout=20)
        assert launcher.returncode == expected, out
        assert "stopping all workers" in out
        assert _wait_gone(workers) == []
    finally:
        launcher.kill()
        _kill_leftovers(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_sigkill_of_launcher_kills_workers(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = _start_launcher(tmp_path, pids)
    try:
        workers = _pids(pids, 2)
        launcher.kill()
        launcher.wait(timeout=10)
        assert _wait_gone(workers) == []
    finally:
        launcher.kill()
        _kill_leftovers(pids)


ALL_REDUCE = """
import os
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
values = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group + 1))
)
total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
print(f"replicas={strategy.num_replicas_in_sync} sum={float(total)}", flush=True)
"""


@pytest.mark.slow
def test_real_multiworker_all_reduce(tmp_path):
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    stream = io.StringIO()
    env = _env(TF_CPP_MIN_LOG_LEVEL="2")
    code = run_workers(
        [sys.executable, str(script)],
        2,
        log_dir=tmp_path / "logs",
        env=env,
        stream=stream,
        hang_timeout_s=120,
    )
    out = stream.getvalue()
    assert code == 0, out
    for i in range(2):
        assert f"[worker {i}] replicas=2 sum=3.0" in out, out


# A worker that prints what it sees: the launcher's real processes, no TensorFlow.
SHOW_GPUS = [sys.executable, "-c", "import os; print('sees', os.environ['CUDA_VISIBLE_DEVICES'])"]


@pytest.mark.parametrize(
    "visible, workers, per_worker, expected",
    [
        ("0,1,2,3", 2, None, ["0,1", "2,3"]),
        ("0,1,2,3", 2, 1, ["0", "1"]),
        ("4,5,6", 3, None, ["4", "5", "6"]),  # the launcher's own subset is what it shares
        ("0,1", 2, 0, [""] * 2),  # --gpus-per-worker 0: every GPU hidden, workers on the CPU
        ("0", 2, None, [""] * 2),  # Colab: 1 GPU for 2 workers, so both on the CPU
    ],
)
def test_each_worker_sees_its_own_gpus(tmp_path, visible, workers, per_worker, expected):
    stream = io.StringIO()
    code = run_workers(
        SHOW_GPUS, workers, log_dir=tmp_path, env=_env(CUDA_VISIBLE_DEVICES=visible),
        stream=stream, gpus_per_worker=per_worker,
    )  # fmt: skip
    out = stream.getvalue()
    assert code == 0, out
    for i, gpus in enumerate(expected):
        assert f"[worker {i}] sees {gpus}\n" in out, out
    assert "[launch] CUDA_VISIBLE_DEVICES worker 0: " in out
    on_cpu_note = "[launch] 1 GPU for 2 workers: the workers run on the CPU"
    assert (on_cpu_note in out) == (visible == "0"), out


@pytest.mark.parametrize("visible", ["", "0", "0,1"])  # a laptop, Colab, Kaggle's 2×T4
def test_the_plain_workers_and_mdtrain_launch_get_the_same_devices(tmp_path, visible):
    # Notebook 07 starts its plain script with `cuda_visible_devices[i]` for worker i, and
    # `mdtrain launch` with `gpus_per_worker`: the two runs it compares must match.
    env = _env(CUDA_VISIBLE_DEVICES=visible)
    devices = worker_devices(2, visible_gpus(env))
    stream = io.StringIO()
    code = run_workers(
        SHOW_GPUS, 2, log_dir=tmp_path, env=env, stream=stream,
        gpus_per_worker=devices.gpus_per_worker,
    )  # fmt: skip
    out = stream.getvalue()
    assert code == 0, out
    for i, gpus in enumerate(devices.cuda_visible_devices):
        assert f"[worker {i}] sees {gpus}\n" in out, out
    assert devices.cuda_visible_devices == (("0", "1") if visible == "0,1" else ("", ""))


def test_kaggle_two_t4s_give_each_of_two_workers_one(tmp_path, monkeypatch):
    from tests.test_gpus import fake_nvml

    fake_nvml(monkeypatch, 2)  # the launcher counts the GPUs, through NVML
    env = _env(CUDA_DEVICE_ORDER="FASTEST_FIRST")  # CUDA's default: not NVML's numbering
    env.pop("CUDA_VISIBLE_DEVICES", None)
    show = [*SHOW_GPUS[:-1], SHOW_GPUS[-1][:-1] + ", os.environ['CUDA_DEVICE_ORDER'])"]
    stream = io.StringIO()
    assert run_workers(show, 2, log_dir=tmp_path / "logs", env=env, stream=stream) == 0
    out = stream.getvalue()
    # NVML's index 1 is CUDA's index 1: the worker's monitor row shows the GPU it trains on.
    assert "[worker 0] sees 0 PCI_BUS_ID\n" in out and "[worker 1] sees 1 PCI_BUS_ID\n" in out, out


def test_a_machine_without_gpus_leaves_the_workers_environment_alone(tmp_path, monkeypatch):
    from tests.test_gpus import fake_nvml

    fake_nvml(monkeypatch, 0)
    env = _env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    show = [sys.executable, "-c", "import os; print('sees', os.getenv('CUDA_VISIBLE_DEVICES'))"]
    stream = io.StringIO()
    assert run_workers(show, 2, log_dir=tmp_path / "logs", env=env, stream=stream) == 0
    out = stream.getvalue()
    assert "[worker 0] sees None\n" in out and "[worker 1] sees None\n" in out, out
    assert "CUDA_VISIBLE_DEVICES" not in out and "on the CPU" not in out, out


def test_too_few_gpus_is_one_line_and_exit_2(tmp_path):
    env = _env(CUDA_VISIBLE_DEVICES="0,1")
    done = subprocess.run(
        [sys.executable, "-m", "mdtrain", "launch", "--workers", "2", "--gpus-per-worker", "2",
         "--log-dir", str(tmp_path / "logs"), "--", "--epochs", "1"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "mdtrain: error: --gpus-per-worker 2 with 2 workers needs 4 GPUs but 2 GPUs are "
        "visible: pass fewer workers or GPUs per worker"
    ]
    assert done.stdout == "" and not (tmp_path / "logs").exists()  # no worker was started


# Parameter-server roles (`launch --ps M`): a small stand-in task, no TensorFlow.
ROLE_TASK = [
    sys.executable,
    "-c",
    textwrap.dedent("""
    import json, os, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    role, index = config["task"]["type"], config["task"]["index"]
    assert os.environ["MDTRAIN_ROLE"] == role
    print(f"{role}={index} cluster={json.dumps(config['cluster'], sort_keys=True)}", flush=True)
    print(f"{role}={index} cuda={os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
          f"order={os.environ['CUDA_DEVICE_ORDER']}", flush=True)
    code = os.environ.get("ROLE_EXIT_" + f"{role}_{index}".upper())
    if code is not None:
        time.sleep(float(os.environ.get("ROLE_EXIT_DELAY", "0")))
        sys.exit(int(code))
    time.sleep(float(os.environ.get("ROLE_SLEEP", "600")) if role == "chief" else 600)
"""),
]


def _run_roles(tmp_path, workers=2, ps=1, **env):
    stream = io.StringIO()
    code = launch_mod.jobs._run_ps_cluster(
        ROLE_TASK, ROLE_TASK, workers, ps, log_dir=tmp_path / "logs",
        env=_env(**env), stream=stream, hang_timeout_s=30,
    )  # fmt: skip
    return code, stream.getvalue()


def test_ps_job_gives_every_role_its_tf_config_and_ends_with_the_chief(tmp_path):
    # The chief exits after a second: time for every server to print before it is stopped.
    code, out = _run_roles(tmp_path, ROLE_EXIT_DELAY="1", ROLE_EXIT_CHIEF_0="7")
    assert code == 7, out
    clusters = {m.group(2) for m in re.finditer(r"\] (\w+=\d) cluster=(.*)", out)}
    assert len(clusters) == 1, out  # one cluster, seen by every task
    cluster = json.loads(clusters.pop())
    assert [len(cluster[r]) for r in ("chief", "worker", "ps")] == [1, 2, 1]
    addresses = [a for role in cluster.values() for a in role]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    for label, task in (("ps 0", "ps=0"), ("worker 0", "worker=0"), ("worker 1", "worker=1"),
                        ("chief", "chief=0")):  # fmt: skip
        assert f"[{label}] {task} cluster=" in out, out
        assert (tmp_path / "logs" / f"{label.replace(' ', '-')}.log").exists()
    assert "the chief exited with code 7; stopping the servers" in out


def test_ps_job_outlives_a_worker_but_not_a_ps(tmp_path):
    # The chief ends on its own (0) after a worker has died: the job goes on without it.
    code, out = _run_roles(tmp_path / "a", ROLE_SLEEP="5", ROLE_EXIT_WORKER_1="1")
    assert code == 0, out
    assert "worker 1 exited with code 1; the chief reruns its steps on the others" in out
    # A parameter server holds variables: losing it ends the job at once, with its status.
    start = time.monotonic()
    code, out = _run_roles(tmp_path / "b", ROLE_EXIT_PS_0="3")
    assert code == 3 and time.monotonic() - start < 25, out
    assert "ps 0 exited with code 3: its variables are lost; stopping all" in out


def test_ps_job_on_one_gpu_runs_its_workers_on_the_cpu_and_says_so(tmp_path):
    code, out = _run_roles(tmp_path, ROLE_EXIT_CHIEF_0="0", ROLE_EXIT_DELAY="1",
                           CUDA_VISIBLE_DEVICES="0")  # fmt: skip
    assert code == 0, out
    assert "[launch] 1 GPU for 2 workers: the workers run on the CPU" in out, out
    for label in ("worker 0] worker=0", "worker 1] worker=1", "ps 0] ps=0", "chief] chief=0"):
        assert f"[{label} cuda=''" in out, out  # nobody takes the GPU


def test_ps_job_on_two_gpus_gives_each_worker_one(tmp_path):
    code, out = _run_roles(tmp_path, ROLE_EXIT_CHIEF_0="0", ROLE_EXIT_DELAY="1",
                           CUDA_VISIBLE_DEVICES="0,1")  # fmt: skip
    assert code == 0 and "the workers run on the CPU" not in out, out
    assert "[worker 0] worker=0 cuda='0'" in out and "[worker 1] worker=1 cuda='1'" in out, out
    assert "[ps 0] ps=0 cuda=''" in out and "[chief] chief=0 cuda=''" in out, out


def test_ps_job_gives_each_worker_one_gpu_of_many(tmp_path):
    # The chief counts a worker's GPUs as replicas, each of which would take a whole batch.
    code, out = _run_roles(tmp_path / "a", ROLE_EXIT_CHIEF_0="0", ROLE_EXIT_DELAY="1",
                           CUDA_VISIBLE_DEVICES="0,1,2,3")  # fmt: skip
    assert code == 0, out
    assert "[worker 0] worker=0 cuda='0' order=PCI_BUS_ID" in out, out
    assert "[worker 1] worker=1 cuda='1' order=PCI_BUS_ID" in out, out
    assert "[ps 0] ps=0 cuda='' order=PCI_BUS_ID" in out, out
    with pytest.raises(UsageError, match="--gpus-per-worker 2 with --ps: a parameter-server "
                       "worker computes on one GPU; pass 1 or 0"):  # fmt: skip
        launch_mod.jobs._run_ps_cluster(ROLE_TASK, ROLE_TASK, 2, 1, gpus_per_worker=2,
                                        env=_env(CUDA_VISIBLE_DEVICES="0,1,2,3"))  # fmt: skip


def test_launch_ps_command_and_bad_input(monkeypatch):
    seen = []
    monkeypatch.setattr(launch_mod.jobs, "_run_ps_cluster", lambda *a, **kw: seen.append(a) or 0)
    assert launch(2, ["--epochs", "1", "--strategy", "ps"], num_ps=1) == 0
    chief, server, workers, ps = seen[0]
    assert chief == [sys.executable, "-m", "mdtrain", "train", "--epochs", "1", "--strategy", "ps"]
    assert server == [sys.executable, "-m", "mdtrain.ps", "serve"] and (workers, ps) == (2, 1)
    with pytest.raises(UsageError, match="parameter-server"):
        launch(2, ["--strategy", "mirrored"], num_ps=1)
    with pytest.raises(UsageError, match="--restarts"):
        launch(2, [], num_ps=1, restarts=1)
    monkeypatch.undo()
    with pytest.raises(UsageError, match="--workers 0 --ps 1: pass at least 1 of each"):
        launch(0, [], num_ps=1)


def test_a_train_command_of_your_own_gets_the_train_arguments(tmp_path, monkeypatch):
    # A fault drill's chief adds a callback this way: its own script, the same arguments.
    shows_argv = [sys.executable, "-c", "import sys; print('argv', sys.argv[1:])"]
    out = io.StringIO()
    code = launch(1, ["--epochs", "1"], train_command=shows_argv, log_dir=tmp_path, stream=out)
    assert code == 0, out.getvalue()
    assert "[worker 0] argv ['--epochs', '1', '--strategy', 'multiworker']" in out.getvalue()
    seen = []
    monkeypatch.setattr(launch_mod.jobs, "_run_ps_cluster", lambda *a, **kw: seen.append(a) or 0)
    launch(2, ["--epochs", "1"], num_ps=1, train_command=["my-chief", "6"])
    chief, server = seen[0][:2]
    assert chief == ["my-chief", "6", "--epochs", "1", "--strategy", "ps"]
    assert server == [sys.executable, "-m", "mdtrain.ps", "serve"]  # the servers stay mdtrain's


def test_cli_launch_ps_bad_strategy_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mdtrain", "launch", "--workers", "2", "--ps", "1", "--",
         "--strategy", "mirrored"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "mdtrain: error: --strategy mirrored: launch --ps runs parameter-server training; "
        "drop --strategy"
    ]


def test_kill_worker_when_kills_only_once_the_file_appears(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env=_env(MDTRAIN_WORKER_INDEX=0))  # fmt: skip
    try:
        kill_worker_when(tmp_path / "never-*", 0, timeout_s=0.3).join(timeout=10)
        with pytest.raises(subprocess.TimeoutExpired):  # the drill timed out: the worker lives
            worker.wait(timeout=1)
        (tmp_path / "ckpt-1").write_text("")
        kill_worker_when(tmp_path / "ckpt-*", 0, timeout_s=10).join(timeout=10)
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait()
