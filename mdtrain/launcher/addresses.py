"""Addresses of a local job: free ports, and each task's `TF_CONFIG`."""

from __future__ import annotations

import socket

from mdtrain.errors import UsageError


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
    return cluster_tf_config({"worker": worker_addresses}, "worker", index)


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
        raise UsageError(f"no task {task_type} {index} in the cluster {cluster}")
    return {
        "cluster": {role: list(addresses) for role, addresses in cluster.items()},
        "task": {"type": task_type, "index": index},
    }


def free_addresses(n: int, host: str) -> list[str]:
    """`n` free `host:port` addresses, with an IPv6 host in brackets (`[::1]:2222`)."""
    return [f"[{host}]:{p}" if ":" in host else f"{host}:{p}" for p in free_ports(n, host)]


def ps_cluster(num_workers: int, num_ps: int, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """A chief, `num_workers` workers and `num_ps` parameter servers on free ports of `host`.

    Args:
        num_workers: workers in the cluster.
        num_ps: parameter servers in the cluster.
        host: the address every task uses. Defaults to `"127.0.0.1"`.

    Returns:
        `{"chief": [address], "worker": [...], "ps": [...]}`, for `cluster_tf_config`.

    Example:
        >>> sorted(len(v) for v in ps_cluster(2, 1).values())
        [1, 1, 2]
    """
    chief, *rest = free_addresses(1 + num_workers + num_ps, host)
    return {"chief": [chief], "worker": rest[:num_workers], "ps": rest[num_workers:]}
