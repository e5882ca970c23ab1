"""One set of GPUs per worker: the `CUDA_VISIBLE_DEVICES` of each local worker.

Without it every worker of `mdtrain launch` would see every GPU: on Kaggle's
2×T4, 2 workers would each build 2 replicas on the same 2 GPUs. The GPUs are
counted without TensorFlow, which must not start in the launcher.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from mdtrain.errors import UsageError


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs a process started with `env` would see: its `CUDA_VISIBLE_DEVICES`, else NVML's."""
    spec = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]  # not MIG slices
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no nvidia-ml-py, no driver, no GPU: all mean none to hand out
            return []
    ids = []
    for item in (s.strip() for s in spec.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry; "-1" hides every GPU
        ids.append(item)
    return ids


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
        replicas = f"{self.num_replicas} replicas in all"
        gpus = "1 GPU" if len(self.gpus) == 1 else f"{len(self.gpus)} GPUs"
        if self.gpus_per_worker:
            shares = "; ".join(
                f"worker {i} on GPU{'s' * (',' in g)} {g}"
                for i, g in enumerate(self.cuda_visible_devices)
            )
            return f"{gpus}: {shares}; {replicas}"
        if not self.gpus:
            return f"no GPU: {self.num_workers} workers on the CPU, 1 replica each; {replicas}"
        return (
            f"{gpus} for {self.num_workers} workers: the workers run on the CPU, 1 replica each "
            f"(a GPU serves one worker process); {replicas}"
        )


def worker_devices(
    num_workers: int, gpus: Sequence[str] | None = None, gpus_per_worker: int | None = None
) -> WorkerDevices:
    """Chooses the devices of `num_workers` local workers: GPUs if each can have one, else CPUs.

    `mdtrain launch`'s choice (docs/multi-worker.md, "Try it on one machine").
    Pass `gpus_per_worker` and `cuda_visible_devices` on to every run that is
    to be compared, so that like is compared with like.

    Args:
        num_workers: How many workers. Must be at least 1.
        gpus: The GPUs to share out. Defaults to `None`: those this process
            sees (its `CUDA_VISIBLE_DEVICES`, else those NVML counts).
        gpus_per_worker: GPUs of each worker, K: worker `i` gets
            `gpus[i*K:(i+1)*K]`, GPUs left over are not used; `0` puts every
            worker on the CPU. Defaults to `None`: `len(gpus) // num_workers`,
            0 with fewer GPUs than workers.

    Returns:
        A `WorkerDevices`.

    Raises:
        UsageError: If `num_workers < 1`, `gpus_per_worker` is negative, or
            it asks for more GPUs than there are.

    Example:
        >>> worker_devices(2, ["0", "1"]).cuda_visible_devices
        ('0', '1')
        >>> worker_devices(2, ["0"]).gpus_per_worker
        0
        >>> worker_devices(2, ["0", "1", "2", "3"], 1).cuda_visible_devices
        ('0', '1')
    """
    gpus = tuple(visible_gpus() if gpus is None else gpus)
    if num_workers < 1:
        raise UsageError(f"--workers {num_workers}: pass 1 or more workers")
    if gpus_per_worker is None:
        gpus_per_worker = len(gpus) // num_workers  # 0 with fewer GPUs than workers: the CPU
    elif gpus_per_worker < 0:
        raise UsageError(f"--gpus-per-worker {gpus_per_worker}: pass 0 or more")
    elif gpus_per_worker * num_workers > len(gpus):
        there = {0: "no GPU is", 1: "1 GPU is"}.get(len(gpus), f"{len(gpus)} GPUs are")
        raise UsageError(
            f"--gpus-per-worker {gpus_per_worker} with {num_workers} workers needs "
            f"{gpus_per_worker * num_workers} GPUs but {there} visible: pass fewer workers or "
            "GPUs per worker"
        )
    shares = tuple(  # consecutive and disjoint
        ",".join(gpus[worker * gpus_per_worker : (worker + 1) * gpus_per_worker])
        for worker in range(num_workers)
    )
    return WorkerDevices(num_workers, gpus, gpus_per_worker, shares)
