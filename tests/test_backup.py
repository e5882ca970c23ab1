"""mdtrain.backup: what a backup folder keeps, what it removes, and what a resumed run reports."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from mdtrain import backup
from mdtrain.backup import BackupWriter, remove_backups, restore, resume_point
from mdtrain.errors import UsageError
from mdtrain.plan import ResumePoint

CHECKPOINT_FILES = ("{}.index", "{}.data-00000-of-00001")


def _files(folder, *names: str):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"x")
    return folder


def _trainer(seed: int = 0, classes: int = 3):
    """A small CNN with dropout in an `ExactTrainer`, built, with an Adam optimizer."""
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    keras.utils.set_random_seed(seed)
    trainer = ExactTrainer(build_model("small-cnn", classes, 16, dropout=0.5))
    trainer.compile(optimizer=keras.optimizers.Adam(0.01))
    trainer.build((None, 16, 16, 3))
    return trainer


def _state(trainer) -> list[np.ndarray]:
    """Everything a resume needs: weights, dropout seeds, optimizer, metric sums."""
    metrics = [v for m in trainer.metrics for v in m.variables]
    return [v.numpy() for v in [*trainer.net.variables, *trainer.optimizer.variables, *metrics]]


def _listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


def _checkpoint_files(*numbers: int) -> list[str]:
    return [f.format(f"mdtrain-ckpt-{n}") for n in numbers for f in CHECKPOINT_FILES]


@pytest.fixture(scope="module")
def trainer():
    """One trainer, its state made unlike a fresh one's: weights, optimizer, seeds, metrics."""
    trainer = _trainer()
    backup.build_optimizer(trainer)
    for variable in [*trainer.optimizer.variables, *trainer.metrics[0].variables]:
        variable.assign(np.full(variable.shape, 7, variable.dtype))
    for variable in backup._rng_state(trainer.net):
        variable.assign(variable + 5)
    return trainer


def test_a_backup_puts_back_every_variable_by_name(trainer, tmp_path):
    """Weights, optimizer, dropout seeds and metric sums come back into another trainer."""
    point = ResumePoint(1, 2, 0, None, {"seed": 1}, [{"loss": 1.5}])
    prefix = BackupWriter(tmp_path, trainer).save(point, number=5)
    other = _trainer(seed=1)
    backup.build_optimizer(other)
    assert not all(
        np.array_equal(a, b) for a, b in zip(_state(trainer), _state(other), strict=True)
    )
    restore(other, resume_point(tmp_path, {"seed": 1}))
    backup._restore_metrics(other, prefix)
    for want, got in zip(_state(trainer), _state(other), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(UsageError, match=r"mdtrain-ckpt-5: does not fit this model"):
        restore(_trainer(classes=4), resume_point(tmp_path))  # another head: refused


def test_a_backup_resumes_where_it_was_saved_and_only_under_the_same_settings(
    trainer, tmp_path, capsys
):
    writer = BackupWriter(tmp_path, trainer)
    for number, older in ((9, ResumePoint(0, 9)), (10, ResumePoint(1, 0))):
        writer.save(older, number)
    point = ResumePoint(2, 5, 1, None, {"seed": 1}, [{"loss": 1.5}])
    prefix = writer.save(point, number=25)
    assert prefix == tmp_path / "mdtrain-ckpt-25"
    want = ["checkpoint", *_checkpoint_files(10, 25), "mdtrain-backup.json"]  # 2 kept
    assert _listing(tmp_path) == sorted(want)
    assert resume_point(tmp_path, {"seed": 1}) == dataclasses.replace(point, path=prefix)
    assert capsys.readouterr().out == f"resuming from {prefix} at epoch 3, step 6\n"
    with pytest.raises(UsageError, match=r"other settings \(seed differ\)"):
        resume_point(tmp_path, {"seed": 2})
    data = tmp_path / "mdtrain-ckpt-25.data-00000-of-00001"
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    with pytest.raises(UsageError, match="mdtrain-ckpt-25 is corrupt .*Checksum does not match"):
        resume_point(tmp_path, {"seed": 1})


def test_a_save_killed_before_its_manifest_leaves_the_previous_backup(
    trainer, tmp_path, monkeypatch, capsys
):
    """The manifest names a checkpoint that exists, however the saves and resumes interleave."""
    BackupWriter(tmp_path, trainer).save(ResumePoint(1, 0), number=10)

    def killed(*args):
        raise KeyboardInterrupt

    def save_killed(number: int) -> None:
        with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
            patch.setattr(backup, "_write_manifest", killed)
            BackupWriter(tmp_path, trainer).save(ResumePoint(2, 0), number)

    save_killed(20)  # the checkpoint written, its manifest not
    assert resume_point(tmp_path, chief=False).path == tmp_path / "mdtrain-ckpt-10"
    assert "mdtrain-ckpt-20.index" in os.listdir(tmp_path)  # a worker removes nothing
    capsys.readouterr()
    assert resume_point(tmp_path).path == tmp_path / "mdtrain-ckpt-10"
    said = capsys.readouterr().out.splitlines()
    assert (
        said[0] == "backup: removed mdtrain-ckpt-20, a save that a killed process left unfinished"
    )
    assert _listing(tmp_path) == sorted([*_checkpoint_files(10), "mdtrain-backup.json"])
    # Saves of another --backup-every-steps after the resume: the manager, its list started
    # afresh, deletes none that the manifest names.
    for number in (12, 14):
        save_killed(number)
        assert resume_point(tmp_path).path == tmp_path / "mdtrain-ckpt-10"


def test_a_save_left_unfinished_is_removed_and_a_damaged_manifest_reported(tmp_path, capsys):
    _files(tmp_path / "mdtrain-ckpt-3_temp", "part-00000-of-00001.index")  # killed mid-save
    _files(tmp_path, "mdtrain-backup.json.abc.tmp")  # killed while writing the manifest
    assert resume_point(tmp_path, chief=False).path is None
    assert capsys.readouterr().out == ""
    assert resume_point(tmp_path).path is None
    assert capsys.readouterr().out == (
        "backup: removed mdtrain-ckpt-3, a save that a killed process left unfinished\n"
    )
    assert os.listdir(tmp_path) == []
    (tmp_path / "mdtrain-backup.json").write_text("{")
    with pytest.raises(UsageError, match="mdtrain-backup.json unreadable"):
        resume_point(tmp_path)


def test_only_mdtrain_backups_are_ever_removed(trainer, tmp_path):
    users = [
        _files(tmp_path / "notes", "todo.txt"),
        _files(tmp_path / "ckpt-best-model", "model.keras"),
        _files(tmp_path, "mdtrain-ckpt-notes.txt") / "mdtrain-ckpt-notes.txt",
    ]
    BackupWriter(tmp_path, trainer).save(ResumePoint(1, 0), number=4)
    remove_backups(tmp_path)
    assert all(path.exists() for path in users)
    assert _listing(tmp_path) == ["ckpt-best-model", "mdtrain-ckpt-notes.txt", "notes"]
    alone = tmp_path / "alone"
    BackupWriter(alone, trainer).save(ResumePoint(1, 0), number=4)
    remove_backups(alone)
    assert not alone.exists()  # the folder too, once nothing else is in it


def test_another_tensorflow_checkpoint_is_never_touched(trainer, tmp_path):
    """A folder whose `checkpoint` list is not mdtrain's: the manager would delete its files."""
    import tensorflow as tf

    theirs = tf.train.Checkpoint(step=tf.Variable(3))
    tf.train.CheckpointManager(theirs, tmp_path, max_to_keep=1).save()  # ckpt-1, as TF names
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    for attempt in (lambda: BackupWriter(tmp_path, trainer), lambda: resume_point(tmp_path)):
        with pytest.raises(UsageError, match="lists TensorFlow checkpoints that mdtrain did not"):
            attempt()
    remove_backups(tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


# mdtrain's format 1 (up to c6c9ed1): one folder per save, these three files in it.
_FORMAT_1 = ("ckpt-00001-000000", ("net.weights.h5", "state.npz", "MANIFEST.json"))


def _format_1_backup(folder):
    name, files = _FORMAT_1
    _files(folder / name, *files)
    manifest = {"epoch": 1, "step": 0, "phase": 0, "fingerprint": {}, "history": [], "files": {}}
    (folder / name / "MANIFEST.json").write_text(json.dumps(manifest))
    return folder


def test_a_backup_in_the_format_before_is_refused_not_read(tmp_path):
    folder = _format_1_backup(tmp_path / "backup")
    before = sorted(folder.rglob("*"))
    for attempt in (lambda: resume_point(folder), lambda: BackupWriter(folder, _trainer())):
        with pytest.raises(UsageError, match="older mdtrain's format .*ckpt-00001-000000/"):
            attempt()
    assert sorted(folder.rglob("*")) == before


@pytest.mark.slow
def test_mdtrain_train_refuses_a_backup_in_the_format_before(tiny_dataset, tmp_path):
    folder = _format_1_backup(tmp_path / "backup")
    cmd = [sys.executable, "-m", "mdtrain", "train", "--data", tiny_dataset, "--image-size", "16"]
    cmd += ["--epochs", "1", "--monitor", "none", "--backup-dir", folder]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"mdtrain: error: --backup-dir {folder}: holds a backup in an older mdtrain's format "
        f"(ckpt-00001-000000/), which this version cannot resume; delete {folder} (or move it "
        "away) to start afresh, or pass another --backup-dir"
    )
    assert (folder / "ckpt-00001-000000" / "state.npz").exists()  # nothing deleted


# Runs of 2 epochs in one fresh process, deterministic, on one device: one whose --output
# cannot be written when it ends (its outputs rescued elsewhere, its backups kept, as when a
# run dies after its last backup); its command asking for fewer epochs; the same command again
# with a writable --output (its backup at the very end: the result); and one stopped when
# epoch 2 begins (its backup after epoch 1 written), then run again.
_RUNS = """
import json, sys
import keras
import numpy as np
from mdtrain.errors import UsageError
from mdtrain.training import TrainConfig, train

def max_weight_difference(a_file, b_file):  # largest |a - b| relative to each tensor's scale
    a, b = (keras.saving.load_model(f, compile=False).get_weights() for f in (a_file, b_file))
    return max(float(np.max(np.abs(x - y), initial=0.0)) / max(float(np.max(np.abs(y))), 1e-12)
               for x, y in zip(a, b, strict=True))

data, work = sys.argv[1], sys.argv[2]
base = dict(data=data, image_size=16, epochs=2, global_batch_size=8, strategy="one",
            deterministic=True, monitor="none", verbose=0)

class TakeTheOutputsPlace(keras.callbacks.Callback):  # a file appears where --output goes
    def on_train_end(self, logs=None):
        open(f"{work}/taken", "w").close()

class Stop(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt

try:
    train(TrainConfig(**base, backup_dir=f"{work}/end", output=f"{work}/taken"),
          callbacks=[TakeTheOutputsPlace()])
    rescued = "saved"
except UsageError as error:
    rescued = str(error)
rescue = rescued.rsplit(" saved to ", 1)[-1].split(" instead")[0]
try:
    train(TrainConfig(**{**base, "epochs": 1}, backup_dir=f"{work}/end"))
    fewer = "trained"
except UsageError as error:
    fewer = str(error)
again = train(TrainConfig(**base, backup_dir=f"{work}/end", output=f"{work}/again"))
try:
    train(TrainConfig(**base, backup_dir=f"{work}/bk", output=f"{work}/b"), callbacks=[Stop()])
except KeyboardInterrupt:
    pass
resumed = train(TrainConfig(**base, backup_dir=f"{work}/bk", output=f"{work}/b"))
print(json.dumps({
    "rescued": rescued, "rescued_history": json.load(open(f"{rescue}/history.json")),
    "resumed": resumed.history, "again": again.history, "fewer": fewer,
    "resumed_vs_rescued": max_weight_difference(f"{work}/b/model.keras",
                                                f"{rescue}/model.keras"),
    "again_vs_rescued": max_weight_difference(f"{work}/again/model.keras",
                                              f"{rescue}/model.keras"),
    "again_report_epochs": json.load(open(f"{work}/again/report.json"))["epochs"],
}))
"""


def _run_script(script: str, data, work) -> dict:
    """Runs `script` with arguments `data` and `work` in a fresh process; its last line's JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(data), str(work)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(work)},  # rescues there
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tiny_dataset, tmp_path_factory) -> dict:
    return _run_script(_RUNS, tiny_dataset, tmp_path_factory.mktemp("backup-runs"))


@pytest.mark.slow
def test_a_resumed_run_reports_every_epoch(runs):
    assert len(runs["resumed"]) == 2 and runs["resumed"] == runs["rescued_history"]
    assert runs["resumed_vs_rescued"] == 0.0


@pytest.mark.slow
def test_a_backup_at_the_very_end_gives_the_trained_model(runs):
    assert runs["again_vs_rescued"] == 0.0  # not the untrained model
    assert runs["again"] == runs["rescued_history"] and runs["again_report_epochs"] == 2
    assert "its backup is at epoch 2, past this run's 1" in runs["fewer"]


@pytest.mark.slow
def test_outputs_that_cannot_be_written_are_saved_elsewhere(runs):
    """A finished run whose --output went away keeps its model, and says where (exit 2)."""
    assert "--output" in runs["rescued"] and "cannot write" in runs["rescued"]
    # The trained model, whole: the same as the run killed and resumed, trained apart.
    assert runs["resumed_vs_rescued"] == 0.0


# Runs of 2 epochs on cpu:2 (3 steps per epoch, global batch 8), for each loop: uninterrupted;
# stopped in epoch 2 after its step 2 (its backup after step 1 written), then run again; and
# with 2 steps per call, stopped after epoch 2's last call (its backup after step 2 written),
# then run again.
_MID_EPOCH = """
import json, sys
from pathlib import Path
import keras
import numpy as np
from mdtrain.training import TrainConfig, train

data, work = sys.argv[1], Path(sys.argv[2])

class Stop(keras.callbacks.Callback):
    def __init__(self, at=1):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch >= self.at:  # before Backup (the last callback) saves
            raise KeyboardInterrupt

def same_weights(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.model.get_weights(), b.model.get_weights()))

def resumed_at(backup):
    return json.loads((backup / "mdtrain-backup.json").read_text())["checkpoint"]

def killed_and_resumed(config, stop):
    try:
        train(config, callbacks=[stop])
    except KeyboardInterrupt:
        pass
    checkpoint = resumed_at(Path(config.backup_dir))
    return checkpoint, train(config)

out = {}
for loop in ("fit", "custom"):
    base = dict(data=data, image_size=16, epochs=2, global_batch_size=8, strategy="cpu:2",
                deterministic=True, monitor="none", verbose=0, loop=loop)
    whole = train(TrainConfig(**base, steps_per_execution=1))  # no backups
    config = TrainConfig(**base, backup_every_steps=1, backup_dir=str(work / loop / "bk"))
    ckpt, resumed = killed_and_resumed(config, Stop())
    per_call = TrainConfig(**base, backup_every_steps=2, steps_per_execution=2,
                           backup_dir=str(work / loop / "spe"))
    spe_ckpt, spe = killed_and_resumed(per_call, Stop(2))
    out[loop] = {
        "whole": whole.history, "resumed": resumed.history, "ckpt": ckpt,
        "spe_ckpt": spe_ckpt, "spe": spe.history,
        "same_weights": same_weights(whole, resumed), "spe_same_weights": same_weights(whole, spe),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mid_epoch_runs(tiny_dataset, tmp_path_factory) -> dict:
    return _run_script(_MID_EPOCH, tiny_dataset, tmp_path_factory.mktemp("mid-epoch-runs"))


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_run_resumed_mid_epoch_reports_the_uninterrupted_figures(mid_epoch_runs, loop):
    runs = mid_epoch_runs[loop]
    assert runs["ckpt"] == "mdtrain-ckpt-4"  # resumed after step 1 of epoch 2's 3
    assert runs["same_weights"]
    whole, resumed = runs["whole"], runs["resumed"]
    assert len(resumed) == len(whole) == 2
    for got, want in zip(resumed, whole, strict=True):
        assert got.keys() == want.keys() == {"loss", "accuracy", "val_loss", "val_accuracy"}
        # The metric sums are put back split over the replicas: the same to float rounding.
        assert got == pytest.approx(want, rel=1e-5, abs=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_backup_between_calls_of_several_steps_resumes_exactly(mid_epoch_runs, loop):
    """2 steps per call (`steps_per_execution`): the backup after a call holds its exact step."""
    runs = mid_epoch_runs[loop]
    assert runs["spe_ckpt"] == "mdtrain-ckpt-5"  # resumed after step 2 of epoch 2's 3
    assert runs["spe_same_weights"]  # as the uninterrupted run of one step per call
    for got, want in zip(runs["spe"], runs["whole"], strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=0.0)
