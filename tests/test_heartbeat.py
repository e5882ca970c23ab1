"""mdtrain.heartbeat: a chief whose epochs outlast a launcher's hang timeout still shows life."""

from __future__ import annotations

from mdtrain.heartbeat import HEARTBEAT_ENV, Heartbeat, heartbeat_from_env


def test_a_line_when_one_is_due_and_only_then(capsys):
    now = [0.0]
    beat = Heartbeat(10.0, clock=lambda: now[0])
    beat.set_params({"steps": 50})
    beat.on_epoch_begin(2)
    for step, seconds in enumerate([3, 9, 11, 15, 22]):
        now[0] = seconds
        beat.on_train_batch_end(step)
    now[0] = 33
    beat.on_test_batch_end(0)
    now[0] = 40
    beat.on_epoch_end(2)  # Keras prints the epoch's own line here
    now[0] = 45
    beat.on_epoch_begin(3)
    beat.on_train_batch_end(0)
    assert capsys.readouterr().out.splitlines() == [
        "epoch 3: step 3/50",
        "epoch 3: step 5/50",
        "epoch 3: validation step 1",
    ]


def test_only_a_launcher_that_asks_gets_one(monkeypatch):
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    assert heartbeat_from_env() == []
    monkeypatch.setenv(HEARTBEAT_ENV, "7.5")
    (beat,) = heartbeat_from_env()
    assert beat.every_s == 7.5
