"""The `mdtrain` command end to end, in fresh processes, as a user runs it."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from mdtrain.choices import (
    BATCH_NORMS,
    CACHE_MODES,
    CLASS_WEIGHTS,
    LITE0,
    LOOPS,
    MODELS,
    MONITOR_DISPLAYS,
    STRATEGIES,
)
from mdtrain.cli import build_parser
from tests.conftest import run_mdtrain

TRAIN_FAST = ["--image-size", "32", "--epochs", "2", "--monitor", "none", "--no-augment"]


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _assert_usage_error(proc, fragment: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mdtrain: error:") and fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_data_synth_then_check_json(tmp_path):
    proc = run_mdtrain("data", "synth", str(tmp_path / "d"), "--classes", "2", "--per-class", "5",
                       "--image-size", "40")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_mdtrain("data", "check", str(tmp_path / "d"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = _last_json(proc.stdout)
    assert report["class_names"] == ["circle", "cross"]
    assert report["counts"] == {
        "train": {"circle": 5, "cross": 5},
        "val": {"circle": 1, "cross": 1},
    }
    assert report["unreadable"] == []


@pytest.mark.slow
def test_train_on_messy_data_with_two_replicas(messy_dataset, tmp_path):
    out = tmp_path / "run"
    proc = run_mdtrain("train", "--data", str(messy_dataset), "--validation-split", "0.25",
                       "--strategy", "cpu:2", "--batch-size-per-replica", "4", "--output", str(out),
                       "--json", *TRAIN_FAST)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "global batch 8 = 4 per replica x 2 replica(s)" in proc.stdout
    summary = _last_json(proc.stdout)
    assert summary["replicas"] == 2 and summary["global_batch_size"] == 8
    assert summary["class_names"] == ["circle", "cross", "square"]
    assert summary["num_train"] + summary["num_val"] == 25
    assert summary["epochs"] == 2 and len(summary["history"]) == 2
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(summary["history"][0])
    assert summary["images_per_sec"] > 0
    # Under fit the monitor counts each step's real size (the partial last batch
    # too) and measures the input wait. Every step counts, the first call's too
    # (at 16 steps per call it holds all 3 steps of epoch 1).
    monitor = summary["monitor"]
    assert monitor["images"] == 2 * summary["num_train"] and monitor["steps"] == 6
    assert monitor["input_wait_share"] is not None and 0 <= monitor["input_wait_share"] < 1
    # "input-bound (moderately): ..." or, when the wait is short, "compute-bound: ..."
    assert monitor["verdict"].split()[0].rstrip(":") in ("input-bound", "compute-bound")
    skipped = sorted(s["path"].rsplit("/", 1)[-1] for s in summary["skipped_files"])
    assert skipped == ["empty.png", "notes.jpg", "truncated.jpg"]
    assert all(s["reason"] for s in summary["skipped_files"])
    assert summary["output"] == str(out)
    for name in ("model.keras", "history.json", "report.json"):
        assert (out / name).is_file()
    assert not (out / "monitor.png").exists()  # --monitor none: no chart
    assert json.loads((out / "report.json").read_text())["replicas"] == 2

    # The same --output again must not overwrite what the first run left.
    before = (out / "model.keras").read_bytes()
    again = run_mdtrain("train", "--data", str(messy_dataset), "--output", str(out), *TRAIN_FAST)
    _assert_usage_error(again, "already holds")
    assert (out / "model.keras").read_bytes() == before


@pytest.mark.slow
def test_train_custom_loop_with_val_folder(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    proc = run_mdtrain("train", "--data", str(tiny_dataset), "--loop", "custom", "--strategy",
                       "cpu:2", "--global-batch-size", "8", "--json", *TRAIN_FAST,
                       "--monitor", "text", "--output", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _last_json(proc.stdout)
    assert summary["num_train"] == 24 and summary["num_val"] == 3
    assert summary["monitor"]["input_wait_share"] is not None  # measured by the custom loop
    # The monitor's chart stays beside the model: what a notebook shows of a run elsewhere.
    from PIL import Image

    assert "mdtrain monitor:" in proc.stdout
    with Image.open(out / "monitor.png") as chart:
        assert chart.format == "PNG" and chart.size == (800, 240)


def _tree(root, spec):
    for cls, n in spec.items():
        (root / cls).mkdir(parents=True)
        for i in range(n):
            (root / cls / f"{i}.jpg").write_bytes(b"")
    return root


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["train", "--model", "resnet50"], "--model resnet50: unknown"),
        (["train", "--strategy", "gpu:7"], "--strategy gpu:7: unknown"),
        (["train", "--epochs", "0"], "--epochs 0"),
        (["train", "--batch-size-per-replica", "0"], "--batch-size-per-replica 0"),
        (["train", "--global-batch-size", "-4"], "--global-batch-size -4"),
        (["train", "--image-size", "0"], "--image-size 0"),
        (["train", "--validation-split", "1.0"], "[0, 1)"),
        (["train", "--learning-rate", "0"], "--learning-rate"),
        (["train", "--loop", "keras"], "--loop keras"),
        (["train", "--model", "efficientnetv2-b0", "--weights", "/nope/w.h5"], "no such file"),
        (["train", "--model", "small-cnn", "--fine-tune-epochs", "2"], "pretrained base"),
        (["train", "--model", "efficientnetv2-b0", "--fine-tune-epochs", "1"], "--weights image"),
        (["train", "--seed", "-1"], "--seed -1: must be in [0, 2**32)"),
        (["train", "--image-size", "12"], "small-cnn needs at least 16 pixels"),
        (["train", "--seed", "4294967296"], "must be in [0, 2**32)"),
        (["train", "--output", "README.md"], "--output README.md: is a file"),
        (["train", "--backup-dir", "README.md"], "--backup-dir README.md: is a file"),
        (["train", "--cache-dir", "README.md"], "--cache-dir README.md: is a file"),
        # Under a file: refused before training, not a traceback when the model is saved.
        (["train", "--output", "README.md/run"], "--output README.md/run: cannot be created"),
        (["train", "--backup-dir", "README.md/b"], "--backup-dir README.md/b: cannot be created"),
        (["train", "--cache-dir", "README.md/c"], "--cache-dir README.md/c: cannot be created"),
        (["train", "--model", "efficientnetv2-b0"], "needs --weights imagenet"),
        (["data", "synth", "README.md/x"], "README.md/x: cannot create it"),
        (["data", "digits", "README.md/x"], "README.md/x: cannot create it"),
        (["data", "synth", "x", "--image-size", "100000"], "between 16 and 4096"),
        (["data", "synth", "x", "--seed", "-1"], "--seed -1"),
        (["train", "--epochs"], "expected one argument"),
        (["frobnicate"], "invalid choice"),
        (["launch", "--workers", "0", "--", "--epochs", "1"], "--workers 0: pass 1 or more"),
        (["train", "--backup-every-steps", "0"], "--backup-every-steps 0: must be at least 1"),
        (["train", "--warmup-epochs", "-1"], "--warmup-epochs -1: must be in [0, 15)"),
        (
            ["train", "--epochs", "3", "--warmup-epochs", "3"],
            "--warmup-epochs 3: must be in [0, 3)",
        ),
        (["train", "--batch-norm", "sync"], "--batch-norm sync: choose one of exact, synchronized"),
        (["train", "--steps-per-execution", "0"], "--steps-per-execution 0: must be at least 1"),
    ],
)
def test_bad_options_fail_fast_in_one_line(args, fragment):
    _assert_usage_error(run_mdtrain(*args, timeout=60), fragment)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, extra, fragment",
    [
        (None, [], "no such folder"),
        ({}, [], "found 0 class folder"),
        ({"cats": 3}, [], "at least two"),
        ({"cats": 0, "dogs": 0}, [], "no image files"),
        ({"cats": 2, "dogs": 2}, [], "none of the training images can be decoded"),
        (
            "tiny",
            ["--global-batch-size", "1", "--strategy", "cpu:2"],
            "smaller than the 2 replicas",
        ),
        ("tiny", ["--global-batch-size", "5", "--strategy", "cpu:2"], "not a multiple"),
        ("tiny-val-mismatch", [], "differ from the training classes"),
    ],
)
def test_bad_data_fails_in_one_line(tmp_path, tiny_dataset, layout, extra, fragment):
    data = tmp_path / "data"
    if layout == "tiny":
        data = tiny_dataset
    elif layout == "tiny-val-mismatch":
        shutil.copytree(tiny_dataset, data)
        (data / "val" / "square").rename(data / "val" / "hexagon")
    elif layout is not None:
        data.mkdir()
        _tree(data, layout)
    _assert_usage_error(run_mdtrain("train", "--data", str(data), *extra, *TRAIN_FAST), fragment)


@pytest.mark.slow
def test_imagenet_weights_offline_is_a_clear_error(tiny_dataset):
    # A proxy that refuses connections makes the download fail at once, network or not.
    offline = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    proc = run_mdtrain("train", "--data", str(tiny_dataset), "--model", "efficientnetv2-b0",
                       "--weights", "imagenet", *TRAIN_FAST, env=offline)  # fmt: skip
    _assert_usage_error(proc, "could not download the ImageNet weights")


@pytest.mark.slow
def test_a_truncated_jpeg_is_reported_once_without_libjpegs_own_lines(tiny_dataset, tmp_path):
    data = tmp_path / "d"
    shutil.copytree(tiny_dataset / "train", data)
    whole = sorted((data / "circle").glob("*.jpg"))[0].read_bytes()
    (data / "circle" / "cut.jpg").write_bytes(whole[: len(whole) * 2 // 3])  # a broken download
    proc = run_mdtrain("data", "check", str(data), env={"MDTRAIN_CACHE_DIR": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr
    assert "cut.jpg" in proc.stdout
    assert "jpeg" not in proc.stderr.lower() and "absl" not in proc.stderr, proc.stderr


def test_data_check_missing_folder(tmp_path):
    _assert_usage_error(run_mdtrain("data", "check", str(tmp_path / "nope")), "no such folder")


def test_python_dash_m_and_help():
    proc = run_mdtrain("--help")
    assert proc.returncode == 0
    for command in ("data", "train", "launch", "predict"):
        assert command in proc.stdout


# Choices that mdtrain.choices checks (one-line errors), not argparse: the help must name them.
CHECKED_CHOICES = {
    ("mdtrain train", "--model"): MODELS,
    ("mdtrain train", "--strategy"): STRATEGIES,
    ("mdtrain train", "--loop"): LOOPS,
    ("mdtrain train", "--class-weight"): CLASS_WEIGHTS,
    ("mdtrain train", "--cache"): CACHE_MODES,
    ("mdtrain train", "--monitor"): MONITOR_DISPLAYS,
    ("mdtrain train", "--batch-norm"): BATCH_NORMS,
    ("mdtrain predict", "--model"): (LITE0,),
}


def _commands(parser, prog="mdtrain"):
    """(command, its parser) for `parser` and every subcommand below it."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            said = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert said.get(name), f"{prog} {name}: no help in {prog} --help"
                yield from _commands(sub, f"{prog} {name}")


def _name(action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest


def _arguments():
    """A pytest param per argument of every command: (command, parser, action, required)."""
    for prog, parser in _commands(build_parser()):
        either = {
            a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions
        }
        for action in parser._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                       argparse._SubParsersAction)):  # fmt: skip
                required = action.required or action in either
                yield pytest.param(prog, parser, action, required, id=f"{prog} {_name(action)}")


@pytest.mark.parametrize("prog, parser, action, required", list(_arguments()))
def test_every_argument_says_what_it_takes_and_its_default(prog, parser, action, required):
    name = _name(action)
    said = parser._get_formatter()._get_help_string(action) or ""  # "(default: ...)" added
    assert said.strip(), f"{prog} {name}: no help"
    choices = action.choices or CHECKED_CHOICES.get((prog, name), ())
    missing = [c for c in choices if str(c) not in said]
    assert not missing, f"{prog} {name}: the help does not name {missing}"
    takes_value = action.option_strings and action.nargs != 0
    if takes_value and required:
        assert "required" in said, f"{prog} {name}: the help does not say it is required"
    elif takes_value:
        assert "default" in said, f"{prog} {name}: the help does not say its default"


def test_the_walk_sees_every_command_and_every_checked_choice():
    commands = {prog for prog, _ in _commands(build_parser())}
    assert {"mdtrain data synth", "mdtrain train", "mdtrain launch",
            "mdtrain predict"} <= commands  # fmt: skip
    seen = {(p.values[0], _name(p.values[2])) for p in _arguments()}
    assert set(CHECKED_CHOICES) <= seen and len(seen) >= 50


def test_a_worker_that_loses_its_peer_says_so_in_one_line(monkeypatch, capsys):
    """When another worker dies, this one's all-reduce fails; the launcher restarts the job."""
    tf = pytest.importorskip("tensorflow")
    from mdtrain import cli

    message = (
        "Graph execution error:\n\nDetected at node small_cnn_1/norm1_1/CollectiveReduceV2_1\n"
        "Collective ops is aborted by: recvmsg:Connection reset by peer\n"
        "The error could be from a previous operation. Restart your program to reset."
    )

    def lose_peer(args):
        raise tf.errors.UnavailableError(None, None, message)

    monkeypatch.setitem(cli._COMMANDS, "train", lose_peer)
    assert cli.main(["train"]) == 1  # not 2: a restart may well succeed
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "mdtrain: error: lost contact with another worker "
        "(Collective ops is aborted by: recvmsg:Connection reset by peer)"
    ]


def test_other_errors_keep_their_traceback(monkeypatch):
    from mdtrain import cli

    def fail(args):
        raise RuntimeError("a bug")

    monkeypatch.setitem(cli._COMMANDS, "train", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train"])


def test_config_from_args_is_the_commands_conversion():
    import dataclasses

    from mdtrain.cli import config_from_args
    from mdtrain.config import TrainConfig

    config = config_from_args(["--epochs", "2", "--strategy", "cpu:2", "--no-augment", "--json"])
    expected = dataclasses.replace(TrainConfig(), epochs=2, strategy="cpu:2", augment=False)
    assert config == expected  # --json says what to print: not the run's


def test_every_train_option_but_the_display_ones_is_a_config_field():
    import dataclasses

    from mdtrain.config import TrainConfig

    parsed = vars(build_parser().parse_args(["train"]))
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    assert set(parsed) - fields == {"command", "json"}


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--mark-after", "6", "--mark-file", "m"], "unrecognized arguments: --mark-after"),
        (["--epochs", "x"], "--epochs: invalid int value"),
        (["--strategy", "cpu:0"], "--strategy"),
    ],
)
def test_config_from_args_refuses_bad_input_in_one_line(argv, fragment):
    from mdtrain.cli import config_from_args
    from mdtrain.errors import UsageError

    with pytest.raises(UsageError) as raised:
        config_from_args(argv)
    message = raised.value.as_option()
    assert fragment in message and len(message.splitlines()) == 1, message


def test_train_help_shows_no_fault_drill():
    train_help = run_mdtrain("train", "--help")
    assert train_help.returncode == 0, train_help.stderr
    assert "--strategy" in train_help.stdout
    assert "drill" not in train_help.stdout and "--mark" not in train_help.stdout
