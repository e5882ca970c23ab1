"""One set of GPUs per worker: the `CUDA_VISIBLE_DEVICES` of each local worker.

Without it every worker of `mdtrain launch` would see every GPU: on Kaggle's
2×T4, 2 workers would each build 2 replicas on the same 2 GPUs. The GPUs are
counted without TensorFlow (which must not start in the launcher): the
launcher's own `CUDA_VISIBLE_DEVICES` when set, else NVML (the driver's
library, which `nvidia-smi` reads too), else none. `worker_devices` is the
choice a notebook makes for N local workers on whatever machine it runs: each
worker its share of the GPUs, or, with fewer GPUs than workers, every worker
on the CPU; `share_gpus` is what `mdtrain launch` sets, the same choice unless
`--gpus-per-worker` asks for another.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from mdtrain.errors import UsageError


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """Lists the GPUs a process started with `env` would see, without TensorFlow.

    Args:
        env: The environment to read `CUDA_VISIBLE_DEVICES` from.
            Defaults to `None`, this process's.

    Returns:
        The device ids as CUDA takes them in `CUDA_VISIBLE_DEVICES`: the
        entries of `env`'s `CUDA_VISIBLE_DEVICES` when it is set (indices or
        UUIDs, up to the first invalid one, as CUDA reads it), else `"0"`,
        `"1"`, ... for each GPU that NVML reports; `[]` on a machine without
        NVIDIA GPUs or driver.

    Example:
        >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"})
        ['2', '3']
    """
    spec = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [str(i) for i in range(_count_with_nvml())]
    ids = []
    for item in (s.strip() for s in spec.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry; "-1" hides every GPU
        ids.append(item)
    return ids


def _count_with_nvml() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())  # whole GPUs, not MIG slices
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no nvidia-ml-py, no driver, no GPU: all mean none to hand out
        return 0


def _split(gpus: Sequence[str], num_workers: int, per_worker: int) -> list[str]:
    """Worker `i` gets `gpus[i*K:(i+1)*K]`, comma-separated: consecutive and disjoint."""
    return [",".join(gpus[i * per_worker : (i + 1) * per_worker]) for i in range(num_workers)]


def _check_workers(num_workers: int) -> None:
    if num_workers < 1:
        raise UsageError(f"--workers {num_workers}: pass 1 or more workers")


@dataclasses.dataclass(frozen=True)
class WorkerDevices:
    """Where each of `num_workers` local workers trains; see `worker_devices`.

    Attributes:
        num_workers: how many workers.
        gpus: the GPUs there were to share (`visible_gpus`).
        gpus_per_worker: GPUs of each worker; `0` puts every worker on the CPU.
        cuda_visible_devices: each worker's `CUDA_VISIBLE_DEVICES`, `""` on the CPU.
    """

    num_workers: int
    gpus: tuple[str, ...]
    gpus_per_worker: int
    cuda_visible_devices: tuple[str, ...]

    @property
    def num_replicas(self) -> int:
        """Replicas of the whole job: one per GPU, or one per worker on the CPU."""
        return self.num_workers * max(self.gpus_per_worker, 1)

    def describe(self) -> str:
        """One line for a reader: where the workers run, and why."""
        n, replicas = self.num_workers, f"{self.num_replicas} replicas in all"
        gpus = "1 GPU" if len(self.gpus) == 1 else f"{len(self.gpus)} GPUs"
        if self.gpus_per_worker:
            shares = "; ".join(
                f"worker {i} on GPU{'s' * (',' in g)} {g}"
                for i, g in enumerate(self.cuda_visible_devices)
            )
            return f"{gpus}: {shares}; {replicas}"
        if not self.gpus:
            return f"no GPU: {n} workers on the CPU, 1 replica each; {replicas}"
        return (
            f"{gpus} for {n} workers: the workers run on the CPU, 1 replica each "
            f"(a GPU serves one worker process); {replicas}"
        )


def worker_devices(num_workers: int, gpus: Sequence[str] | None = None) -> WorkerDevices:
    """Chooses the devices of `num_workers` local workers: GPUs if each can have one, else CPUs.

    With at least one GPU per worker, each worker gets `len(gpus) // num_workers`
    of them (Kaggle's 2×T4, 2 workers: one T4 each). With fewer GPUs than
    workers (Colab's one GPU, 2 workers) every worker runs on the CPU, rather
    than two processes fighting over one GPU's memory; and without a GPU they
    run on the CPU anyway. Pass `gpus_per_worker` and
    `cuda_visible_devices` on to every run that is to be compared, so that
    like is compared with like.

    Args:
        num_workers: How many workers. Must be at least 1.
        gpus: The GPUs to share out. Defaults to `None`: `visible_gpus()`.

    Returns:
        A `WorkerDevices`.

    Raises:
        UsageError: If `num_workers < 1`.

    Example:
        >>> worker_devices(2, ["0", "1"]).cuda_visible_devices
        ('0', '1')
        >>> worker_devices(2, ["0"]).gpus_per_worker
        0
    """
    gpus = tuple(visible_gpus() if gpus is None else gpus)
    _check_workers(num_workers)
    per_worker = len(gpus) // num_workers  # 0 with fewer GPUs than workers: the CPU
    shares = _split(gpus, num_workers, per_worker)
    return WorkerDevices(num_workers, gpus, per_worker, tuple(shares))


def share_gpus(
    gpus: Sequence[str], num_workers: int, gpus_per_worker: int | None = None
) -> tuple[list[str] | None, str | None]:
    """Each launched worker's `CUDA_VISIBLE_DEVICES`, and a line when it chose the CPU.

    What `mdtrain launch` does, with or without parameter servers. Without
    `gpus_per_worker` it makes `worker_devices`' choice: the GPUs split
    evenly, or, with fewer GPUs than workers (2 workers on Colab's one GPU),
    every worker on the CPU, and a line that says so; two processes that
    each take all of one GPU's memory would fail. With `gpus_per_worker` K,
    worker `i` gets `gpus[i*K:(i+1)*K]`; `0` hides every GPU (the CPU).

    Args:
        gpus: The visible GPUs (`visible_gpus`).
        num_workers: Workers, at least 1.
        gpus_per_worker: GPUs of each worker. Defaults to `None`: an even split.

    Returns:
        `(assignment, note)`: one comma-separated string per worker,
        consecutive and disjoint (GPUs left over are not used), or `None` on
        a machine without GPUs and no `gpus_per_worker`: the workers keep the
        launcher's environment; and the line to print when the workers were
        put on the CPU, else `None`.

    Raises:
        UsageError: If `num_workers < 1`, `gpus_per_worker` is negative, or
            it asks for more GPUs than there are.

    Example:
        >>> share_gpus(["0", "1", "2", "3"], 2)
        (['0,1', '2,3'], None)
        >>> share_gpus(["0"], 2)
        (['', ''], '1 GPU for 2 workers: the workers run on the CPU, 1 replica each (a GPU serves one worker process); 2 replicas in all')
    """  # noqa: E501
    _check_workers(num_workers)
    if gpus_per_worker is None:
        if not gpus:
            return None, None
        devices = worker_devices(num_workers, gpus)
        note = None if devices.gpus_per_worker else devices.describe()
        return list(devices.cuda_visible_devices), note
    if gpus_per_worker < 0:
        raise UsageError(f"--gpus-per-worker {gpus_per_worker}: pass 0 or more")
    needed = gpus_per_worker * num_workers
    if needed > len(gpus):
        there = {0: "no GPU is", 1: "1 GPU is"}.get(len(gpus), f"{len(gpus)} GPUs are")
        raise UsageError(
            f"--gpus-per-worker {gpus_per_worker} with {num_workers} workers needs {needed} "
            f"GPUs but {there} visible: pass fewer workers or GPUs per worker"
        )
    return _split(gpus, num_workers, gpus_per_worker), None
