"""Notebook 09's exercise check, on a real parameter-server cluster in a fresh process."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os
    import tensorflow as tf
    from mdtrain_course.exercises import ExerciseError
    from mdtrain_course.exercises.nb09 import check_run_steps
    from mdtrain.launcher import free_ports

    ports = free_ports(2)
    addresses = {"worker": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"]}
    cluster = tf.train.ClusterSpec(addresses)
    for job in ("worker", "ps"):
        tf.distribute.Server(cluster, job_name=job, task_index=0, protocol="grpc", start=True)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def right(coordinator, train_step, iterator, num_steps):
        remote = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(num_steps)]
        coordinator.join()
        return [float(value.fetch()) for value in remote]

    def remote_values(coordinator, train_step, iterator, num_steps):
        return [coordinator.schedule(train_step, args=(iterator,)) for _ in range(num_steps)]

    def one_step(coordinator, train_step, iterator, num_steps):
        value = float(coordinator.schedule(train_step, args=(iterator,)).fetch())
        return [value] * num_steps

    assert check_run_steps(right, strategy, coordinator, strict=True)
    assert not check_run_steps(None, strategy, coordinator)
    wrongs = ((remote_values, "fetch each step's value"), (one_step, "1 of 8 steps ran"))
    for wrong, problem in wrongs:
        assert not check_run_steps(wrong, strategy, coordinator)
        try:
            check_run_steps(wrong, strategy, coordinator, strict=True)
        except ExerciseError as error:
            assert problem in str(error), error
        else:
            raise AssertionError(f"{wrong.__name__} passed")
    print("CHECKS OK")
    os._exit(0)  # the in-process servers never stop by themselves
    """
)


@pytest.mark.slow
def test_the_check_tells_right_from_wrong_on_a_real_cluster():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert "CHECKS OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "✓ Schedule parameter-server steps: it works." in done.stdout
    assert "still the placeholder" in done.stdout
