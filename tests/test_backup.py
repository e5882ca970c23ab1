"""mdtrain.backup: what a backup folder keeps, what it removes, and what a resumed run reports."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

from mdtrain.backup import remove_backups, resume_point, save
from mdtrain.errors import UsageError
from mdtrain.plan import ResumePoint

BACKUP_FILES = ("net.weights.h5", "state.npz", "MANIFEST.json")


def _folder(path, *names: str):
    path.mkdir(parents=True)
    for name in names:
        (path / name).write_bytes(b"x")
    return path


def test_interrupted_save_is_never_loaded(tmp_path, capsys):
    _folder(tmp_path / "mdtrain-tmp-abc", "net.weights.h5")  # killed half-way: never renamed
    _folder(tmp_path / "mdtrain-tmp-def", "net.weights.h5")
    assert resume_point(tmp_path, chief=False).path is None  # a worker removes nothing
    assert capsys.readouterr().out == ""
    assert resume_point(tmp_path).path is None
    assert capsys.readouterr().out.splitlines() == [
        f"backup: removed mdtrain-tmp-{name}, a save that a killed process left unfinished"
        for name in ("abc", "def")
    ]
    assert os.listdir(tmp_path) == []
    (tmp_path / "ckpt-00001-000000").mkdir()  # renamed into place, then damaged: an error
    with pytest.raises(UsageError, match="MANIFEST.json unreadable"):
        resume_point(tmp_path)


def test_a_backup_resumes_where_it_was_saved_and_only_under_the_same_settings(tmp_path, capsys):
    trainer = _trainer()
    for older in (ResumePoint(0, 9), ResumePoint(1, 0)):
        save(tmp_path, trainer, older)
    point = ResumePoint(2, 5, 1, None, {"seed": 1}, [{"loss": 1.5}])
    folder = save(tmp_path, trainer, point)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00001-000000", "ckpt-00002-000005"]  # 2 kept
    assert sorted(os.listdir(folder)) == sorted(BACKUP_FILES)
    assert resume_point(tmp_path, {"seed": 1}) == dataclasses.replace(point, path=folder)
    assert capsys.readouterr().out == f"resuming from {folder} at epoch 3, step 6\n"
    with pytest.raises(UsageError, match=r"other settings \(seed differ\)"):
        resume_point(tmp_path, {"seed": 2})
    (folder / "state.npz").write_bytes(b"x")
    with pytest.raises(UsageError, match="state.npz fails its SHA-256 checksum"):
        resume_point(tmp_path, {"seed": 1})


def test_only_mdtrain_backups_are_ever_removed(tmp_path):
    users = [
        _folder(tmp_path / "tmp-notes", "todo.txt"),
        _folder(tmp_path / "ckpt-best-model", "model.keras"),
        _folder(tmp_path / "ckpt-00001-000000", "net.weights.h5", "my-notes.txt"),
        _folder(tmp_path / "mdtrain-tmp-mine", "thesis.tex"),
    ]
    ours = [
        _folder(tmp_path / "mdtrain-tmp-x1", "net.weights.h5"),
        _folder(tmp_path / "ckpt-00002-000000", *BACKUP_FILES),
    ]
    remove_backups(tmp_path)
    assert all(folder.is_dir() for folder in users) and not any(p.exists() for p in ours)
    assert (tmp_path / "ckpt-00001-000000" / "my-notes.txt").exists()


def _trainer():
    from mdtrain.loop import ExactTrainer, build_optimizer

    trainer = ExactTrainer(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    trainer.compile(optimizer="sgd")
    build_optimizer(trainer)
    return trainer


def test_a_save_never_replaces_a_folder_of_the_users(tmp_path):
    trainer = _trainer()
    _folder(tmp_path / "ckpt-00001-000000", "my-notes.txt")
    with pytest.raises(UsageError, match="not an mdtrain backup; nothing was overwritten"):
        save(tmp_path, trainer, ResumePoint(1, 0))
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00001-000000"]  # no save left half-way
    assert save(tmp_path, trainer, ResumePoint(2, 0)).name == "ckpt-00002-000000"


# Runs of 3 epochs in one fresh process, deterministic, on one device: uninterrupted;
# stopped when epoch 3 begins (its backup after epoch 2 written), then run again; one
# whose backups outlive its end (as when a run dies after its last backup, before its
# outputs), run again with a new --output; then again asking for fewer epochs; and one
# whose --output cannot be written when it ends.
_RUNS = """
import json, sys
import keras
from mdtrain import backup
from mdtrain.errors import UsageError
import numpy as np
from mdtrain.training import TrainConfig, train

def max_weight_difference(a_file, b_file):  # largest |a - b| relative to each tensor's scale
    a, b = (keras.saving.load_model(f, compile=False).get_weights() for f in (a_file, b_file))
    return max(float(np.max(np.abs(x - y), initial=0.0)) / max(float(np.max(np.abs(y))), 1e-12)
               for x, y in zip(a, b, strict=True))

data, work = sys.argv[1], sys.argv[2]
base = dict(data=data, image_size=16, epochs=3, global_batch_size=8, strategy="one",
            deterministic=True, monitor="none", verbose=0)

class Stop(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise KeyboardInterrupt

whole = train(TrainConfig(**base, output=f"{work}/whole"))
try:
    train(TrainConfig(**base, backup_dir=f"{work}/bk", output=f"{work}/b"), callbacks=[Stop()])
except KeyboardInterrupt:
    pass
resumed = train(TrainConfig(**base, backup_dir=f"{work}/bk", output=f"{work}/b"))
backup.remove_backups = lambda folder: None
first = train(TrainConfig(**base, backup_dir=f"{work}/end", output=f"{work}/first"))
again = train(TrainConfig(**base, backup_dir=f"{work}/end", output=f"{work}/again"))
try:
    train(TrainConfig(**{**base, "epochs": 2}, backup_dir=f"{work}/end"))
    fewer = "trained"
except UsageError as error:
    fewer = str(error)

class TakeTheOutputsPlace(keras.callbacks.Callback):  # a file appears where --output goes
    def on_train_end(self, logs=None):
        open(f"{work}/taken", "w").close()

try:
    train(TrainConfig(**base, output=f"{work}/taken"), callbacks=[TakeTheOutputsPlace()])
    rescued = "saved"
except UsageError as error:
    rescued = str(error)
rescue = rescued.rsplit(" saved to ", 1)[-1].split(" instead")[0]
print(json.dumps({
    "rescued": rescued,
    "rescued_vs_whole": max_weight_difference(f"{rescue}/model.keras", f"{work}/whole/model.keras"),
    "whole": whole.history, "resumed": resumed.history,
    "first": first.history, "again": again.history, "fewer": fewer,
    "resumed_vs_whole": max_weight_difference(f"{work}/b/model.keras", f"{work}/whole/model.keras"),
    "again_vs_first": max_weight_difference(f"{work}/again/model.keras",
                                            f"{work}/first/model.keras"),
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
    assert len(runs["resumed"]) == 3 and runs["resumed"] == runs["whole"]
    assert runs["resumed_vs_whole"] == 0.0


@pytest.mark.slow
def test_a_backup_at_the_very_end_gives_the_trained_model(runs):
    assert runs["again_vs_first"] == 0.0  # not the untrained model
    assert runs["again"] == runs["first"] and runs["again_report_epochs"] == 3
    assert "its backup is at epoch 3, past this run's 2" in runs["fewer"]


@pytest.mark.slow
def test_outputs_that_cannot_be_written_are_saved_elsewhere(runs):
    """A finished run whose --output went away keeps its model, and says where (exit 2)."""
    assert "--output" in runs["rescued"] and "cannot write" in runs["rescued"]
    assert runs["rescued_vs_whole"] == 0.0  # the trained model, whole


# Runs of 2 epochs on cpu:2 (3 steps per epoch, global batch 8), for each loop: uninterrupted;
# stopped in epoch 2 after its step 2 (its backup after step 1 written), then run again; and
# that backup made as an older mdtrain made it (no metric state, checksum updated), run again;
# and with 2 steps per call, stopped after epoch 2's last call (its backup after step 2
# written), then run again.
_MID_EPOCH = """
import contextlib, hashlib, io, json, shutil, sys
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

def weights(result):
    return result.model.get_weights()

def without_metrics(backup):  # as an mdtrain that saved no metric state left it
    ckpt = sorted(backup.glob("ckpt-*"))[-1]
    with np.load(ckpt / "state.npz") as state:
        kept = {k: state[k] for k in state.files if not k.startswith(("metric_", "num_metrics"))}
    np.savez(ckpt / "state.npz", **kept)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["files"]["state.npz"] = hashlib.sha256((ckpt / "state.npz").read_bytes()).hexdigest()
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))
    return ckpt.name

out = {}
for loop in ("fit", "custom"):
    base = dict(data=data, image_size=16, epochs=2, global_batch_size=8, strategy="cpu:2",
                deterministic=True, monitor="none", verbose=0, loop=loop,
                backup_every_steps=1)
    whole = train(TrainConfig(**base, backup_dir=str(work / loop / "whole")))
    backup = work / loop / "bk"
    try:
        train(TrainConfig(**base, backup_dir=str(backup)), callbacks=[Stop()])
    except KeyboardInterrupt:
        pass
    shutil.copytree(backup, work / loop / "old")
    resumed = train(TrainConfig(**base, backup_dir=str(backup)))
    ckpt = without_metrics(work / loop / "old")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        old = train(TrainConfig(**base, backup_dir=str(work / loop / "old")))
    per_call = dict(base, backup_every_steps=2, steps_per_execution=2)
    try:
        train(TrainConfig(**per_call, backup_dir=str(work / loop / "spe")), callbacks=[Stop(2)])
    except KeyboardInterrupt:
        pass
    spe_ckpt = sorted((work / loop / "spe").glob("ckpt-*"))[-1].name
    spe = train(TrainConfig(**per_call, backup_dir=str(work / loop / "spe")))
    out[loop] = {
        "whole": whole.history, "resumed": resumed.history, "old": old.history,
        "ckpt": ckpt, "said": said.getvalue(), "spe_ckpt": spe_ckpt, "spe": spe.history,
        "spe_same_weights": all(np.array_equal(a, b) for a, b in zip(weights(whole), weights(spe))),
        "same_weights": all(np.array_equal(a, b) for a, b in zip(weights(whole), weights(resumed))),
        "old_same_weights": all(np.array_equal(a, b) for a, b in zip(weights(whole), weights(old))),
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
    assert runs["ckpt"] == "ckpt-00001-000001"  # resumed after step 1 of epoch 2's 3
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
    assert runs["spe_ckpt"] == "ckpt-00001-000002"  # resumed after step 2 of epoch 2's 3
    assert runs["spe_same_weights"]  # as the uninterrupted run of one step per call
    for got, want in zip(runs["spe"], runs["whole"], strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_backup_without_metric_state_still_resumes(mid_epoch_runs, loop):
    """A backup made before mdtrain saved the metrics: same weights; one line says what differs."""
    runs = mid_epoch_runs[loop]
    assert runs["old_same_weights"]
    assert runs["said"].count("holds no training metrics") == 1
    assert runs["old"][0] == runs["whole"][0]  # an epoch before the resume, from the manifest
    assert runs["old"][1]["val_loss"] == pytest.approx(runs["whole"][1]["val_loss"], rel=1e-6)
    assert runs["old"][1]["loss"] != pytest.approx(runs["whole"][1]["loss"], rel=1e-3)
