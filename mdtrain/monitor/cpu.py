"""Host readings through psutil: CPU utilisation and this process's memory."""

from __future__ import annotations

import psutil

from mdtrain.monitor.samples import DeviceSample


class CpuReader:
    """Reads the host's CPU utilisation and this process's resident memory.

    CPU utilisation is the average since the previous ``read()`` (psutil's
    non-blocking mode), so the sampling thread never sleeps inside psutil.

    Example:

    ```python
    print(CpuReader().read())
    ```
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._total = int(psutil.virtual_memory().total)
        psutil.cpu_percent(interval=None)  # primes the counter; the first call returns 0.0

    def read(self) -> DeviceSample:
        """Reads the CPU once.

        Returns:
            A `DeviceSample` of kind ``"cpu"``: utilisation over all cores,
            memory_used = this process's RSS, memory_total = host RAM.
        """
        try:
            rss = int(self._process.memory_info().rss)
        except psutil.Error:
            rss = None
        return DeviceSample(
            name="CPU",
            kind="cpu",
            utilization=float(psutil.cpu_percent(interval=None)),
            memory_used=rss,
            memory_total=self._total,
        )
