"""Parameter-server training: `ParameterServerStrategy` with a `ClusterCoordinator`.

A cluster of three roles. **Parameter servers** (`ps`) hold the variables,
sharded across them when there are several. **Workers** each hold nothing
of their own: they run whole training steps — the *whole* model, forward
and backward, on a batch of their own — reading the variables from the
parameter servers and sending the updates back. The **chief** (the
coordinator) builds the model and schedules steps; each step goes to
whichever worker is free. Nobody waits for anybody: updates are
*asynchronous*, so a step may compute its gradient from weights that other
workers have changed meanwhile (*stale* gradients), and the weights cannot
equal those of one device.

The chief runs `mdtrain.training.train` with `strategy="ps"`: the same data,
input pipeline, model, exact step, learning-rate schedule and outputs as
every other strategy, in the coordinator's loop (`loop.coordinator_fit`:
Keras 3's `fit` cannot run here). Every server starts with enough threads
to avoid a hang on small machines (`cluster`: the thread-pool trap).
Notebook 07 writes the same training in plain TensorFlow.

Security: the servers speak unauthenticated, unencrypted gRPC, exactly as
under MultiWorkerMirroredStrategy; keep them on loopback or a trusted
network (see `mdtrain.launcher`).

Modules: `cluster` (the servers), `loop` (the chief's loop), `__main__`
(`python -m mdtrain.ps serve|chief`). `mdtrain launch --workers N --ps M`
starts a whole job as local processes.
"""

from __future__ import annotations

from mdtrain.ps.cluster import MIN_INTER_OP_THREADS, serve, server_config
from mdtrain.ps.loop import coordinator_fit

__all__ = ["MIN_INTER_OP_THREADS", "coordinator_fit", "serve", "server_config"]
