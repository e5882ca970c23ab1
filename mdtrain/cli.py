"""The `mdtrain` command: `data`, `train`, `launch`, `predict`.

Kept thin: each subcommand parses its options into the arguments of one library function.
Bad input ends in one line and exit code 2, never a traceback, checked before the commands
that need TensorFlow import it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence

from mdtrain.config import TrainConfig
from mdtrain.errors import USAGE_EXIT_CODE, UsageError
from mdtrain.tf_import import import_tensorflow


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to an option's help, where there is a default to tell."""

    def _get_help_string(self, action):
        told = "(default" in (action.help or "")
        if told or any(action.default is value for value in (None, False, True)):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse that shows defaults and reports errors in one line, like every mdtrain error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        raise UsageError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="make, fetch or check a class-folder dataset")
    data_commands = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    synth = data_commands.add_parser(
        "synth", help="write the synthetic demo dataset (JPEG, train/ and val/)"
    )
    synth.add_argument("out", help="new folder for the dataset")
    synth.add_argument("--classes", type=int, default=5, help="number of shape classes, 2 to 5")
    synth.add_argument("--per-class", type=int, default=300, help="training images per class")
    synth.add_argument("--image-size", type=int, default=256, help="side of the images, pixels")
    synth.add_argument("--seed", type=int, default=0, help="seed of the drawing")
    digits = data_commands.add_parser(
        "digits", help="write scikit-learn's handwritten digits (PNG)"
    )
    digits.add_argument("out", help="new folder for the dataset")
    flowers = data_commands.add_parser(
        "flowers", help="download TensorFlow's flower photos (needs network)"
    )
    flowers.add_argument("--cache-dir", default="data", help="where the download is kept")
    check = data_commands.add_parser(
        "check", help="report classes, counts, unreadable and mislabelled files"
    )
    check.add_argument("dir", help="a class-folder dataset (train/ and val/, or class folders)")
    check.add_argument("--json", action="store_true", help="print one JSON object")


def _add_train(sub) -> None:
    from mdtrain import choices
    from mdtrain.choices import AUGMENT_IN, CLASS_WEIGHTS, LITE0, LOOPS, MODELS, STRATEGIES

    parser = sub.add_parser("train", help="train an image classifier under a distribution strategy")
    parser.add_argument(
        "--data",
        help="dataset folder with one sub-folder per class (default: the "
        "demo dataset, made on first use)",
    )
    validation = parser.add_mutually_exclusive_group()
    validation.add_argument(
        "--val-data",
        help="validation folder with the same class folders (default: "
        "val/ beside train/ in --data, else --validation-split)",
    )
    validation.add_argument(
        "--validation-split",
        type=float,
        help="share of --data held out for validation, in [0, 1); 0: none, use val/ or --val-data",
    )
    parser.add_argument("--model", help=f"the classifier: {', '.join(MODELS)}")
    parser.add_argument(
        "--weights", help="imagenet, none, or a weights file (EfficientNet models only)"
    )
    sizes = {name: TrainConfig(model=name).resolved_image_size for name in ("small-cnn", LITE0)}
    parser.add_argument(
        "--image-size",
        type=int,
        help="side of the square input (default: "
        f"{sizes['small-cnn']} for small-cnn, {sizes[LITE0]} otherwise)",
    )
    batch_size = parser.add_mutually_exclusive_group()
    batch_size.add_argument(
        "--batch-size-per-replica",
        type=int,
        help="examples per replica per step (default: 32 per replica)",
    )
    batch_size.add_argument(
        "--global-batch-size",
        type=int,
        help="examples per step over all replicas, a multiple of the replicas "
        "(default: 32 per replica x the replicas)",
    )
    parser.add_argument("--epochs", type=int, help="training epochs")
    parser.add_argument(
        "--fine-tune-epochs",
        type=int,
        help="then epochs of fine-tuning the top of a pretrained base",
    )
    parser.add_argument(
        "--learning-rate", type=float, help="peak learning rate (cosine decay to a tenth)"
    )
    parser.add_argument(
        "--warmup-epochs",
        type=int,
        help="first rise linearly from 0 to "
        "--learning-rate over this many epochs (fewer than --epochs)",
    )
    parser.add_argument("--strategy", help=f"{', '.join(STRATEGIES)} (N virtual CPU replicas)")
    parser.add_argument(
        "--loop",
        help=f"{' or '.join(LOOPS)}: model.fit, or the custom strategy.run loop (same weights)",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=int,
        help="training steps per call of the "
        "compiled step; callbacks see every N-th (default: 16, or the largest "
        "divisor of --backup-every-steps up to 16)",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="bfloat16; float16 with loss scaling on GPUs below compute capability 8.0 (T4, V100)",
    )
    parser.add_argument(
        "--no-augment",
        dest="augment",
        action="store_false",
        help="train without random flips, rotations and zooms",
    )
    parser.add_argument(
        "--augment-in",
        help=f"{', '.join(AUGMENT_IN)}: augment in the input "
        "pipeline (CPU) or in the training step (each replica's device); auto: "
        "in the training step",
    )
    parser.add_argument("--dropout", type=float, help="dropout before the last layer")
    parser.add_argument(
        "--batch-norm",
        help=f"{', '.join(choices.BATCH_NORMS)}: global statistics "
        "(N replicas = 1), Keras' synchronized or per-replica layer",
    )
    parser.add_argument(
        "--class-weight",
        help=f"{' or '.join(CLASS_WEIGHTS)}: auto weighs the loss to balance classes",
    )
    parser.add_argument("--seed", type=int, help="seed of weights, shuffling and augmentation")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="bit-reproducible runs: "
        "slower, on GPUs more (deterministic, slower cuDNN algorithms); refused "
        "before training where TensorFlow has no deterministic op",
    )
    _add_train_keeping(parser)
    # `TrainConfig` holds each training default once: the options use and show its values.
    parser.set_defaults(**{field.name: field.default for field in dataclasses.fields(TrainConfig)})


def _add_train_keeping(parser) -> None:
    """Where `train` keeps decoded images, backups and results, and what it shows."""
    from mdtrain.choices import CACHE_MODES, MONITOR_DISPLAYS

    parser.add_argument(
        "--cache",
        help=f"{', '.join(CACHE_MODES)}: where decoded images are kept; auto keeps "
        "them in memory when they fit, else on disk with --cache-dir, else "
        "streams them",
    )
    parser.add_argument(
        "--cache-dir",
        help="folder for --cache disk, never inside your data "
        "(default: none: --cache auto streams what memory cannot hold)",
    )
    parser.add_argument(
        "--backup-dir",
        help="back up to this folder every epoch, and resume from it (default: no backups)",
    )
    parser.add_argument(
        "--backup-every-steps",
        type=int,
        help="also back up every N steps within an epoch (needs --backup-dir; "
        "default: at the end of each epoch only)",
    )
    parser.add_argument(
        "--output",
        help="new folder for model.keras, history.json, report.json "
        "and, with a monitor, its chart monitor.png "
        "(default: nothing written)",
    )
    parser.add_argument(
        "--monitor",
        help=f"{', '.join(MONITOR_DISPLAYS)}: auto is a live dashboard in notebooks, "
        "a text line per epoch elsewhere",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON summary line")
    parser.add_argument(
        "--log-every", type=int, help="--strategy ps: steps per point of the loss curve"
    )


def _add_launch(sub) -> None:
    from mdtrain.launcher.processes import HANG_TIMEOUT_S

    parser = sub.add_parser(
        "launch",
        help="run `mdtrain train --strategy multiworker` as N local workers",
        usage="mdtrain launch --workers N [--ps M] [--restarts R] [--gpus-per-worker K] -- <args>",
    )
    parser.add_argument(
        "--workers",
        type=int,
        required=True,
        help="worker processes on this machine, 127.0.0.1 only (required)",
    )
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        metavar="M",
        help="M parameter servers: asynchronous parameter-server training (notebook 09); "
        "0: multi-worker training",
    )
    parser.add_argument(
        "--restarts", type=int, default=0, help="restart all workers up to R times when one fails"
    )
    parser.add_argument("--log-dir", help="per-worker logs (default: a temporary folder)")
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=HANG_TIMEOUT_S,
        help="seconds after which workers count as stuck: one finished and the "
        "others not, or none printed anything",
    )
    parser.add_argument(
        "--gpus-per-worker",
        type=int,
        default=None,
        metavar="K",
        help="GPUs in each worker's CUDA_VISIBLE_DEVICES (default: the GPUs split evenly; "
        "0: workers on the CPU)",
    )
    parser.add_argument(
        "train_args",
        nargs=argparse.REMAINDER,
        help="after --: the mdtrain train arguments (a leading 'train' is fine)",
    )


def _add_predict(sub) -> None:
    from mdtrain.choices import LITE0

    parser = sub.add_parser(
        "predict",
        help="classify image files with a trained model or the ImageNet network",
        usage="mdtrain predict IMAGE_OR_DIR... (--model-file RUN/model.keras | "
        "--model efficientnet-lite0 --weights imagenet) [--top K] [--json]",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help="image files and folders (searched recursively)",
    )
    model_source = parser.add_mutually_exclusive_group(required=True)
    model_source.add_argument(
        "--model-file",
        help="a run's model.keras, class names from its report.json (this or --model is required)",
    )
    model_source.add_argument(
        "--model",
        help=f"{LITE0}: the pretrained ImageNet network (this or --model-file is required)",
    )
    parser.add_argument(
        "--weights", default="imagenet", help="with --model: imagenet or a weights file"
    )
    parser.add_argument("--top", type=_positive_int, default=5, help="classes listed per image")
    parser.add_argument(
        "--image-size", type=_positive_int, help="input side (default: the model's)"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object")


def build_parser() -> argparse.ArgumentParser:
    """The `mdtrain` argument parser."""
    from mdtrain import __version__

    parser = _Parser(prog="mdtrain", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mdtrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_data(sub)
    _add_train(sub)
    _add_launch(sub)
    _add_predict(sub)
    return parser


def _run_data(args) -> int:
    from mdtrain import sources

    if args.data_command == "synth":
        out = sources.make_synthetic_dataset(
            args.out, args.classes, args.per_class, args.image_size, args.seed
        )
        print(f"wrote the synthetic dataset to {out}")
    elif args.data_command == "digits":
        print(f"wrote the digits dataset to {sources.write_digits_dataset(args.out)}")
    elif args.data_command == "flowers":
        print(f"flowers dataset in {sources.download_flowers(args.cache_dir)}")
    else:
        from mdtrain.data import check_dataset

        report = check_dataset(args.dir)
        if args.json:
            print(json.dumps(report.to_dict()), flush=True)
        else:
            print(report.to_text())
    return 0


#: The options of `mdtrain train` that are not `TrainConfig` fields: they say what to print.
_DISPLAY_OPTIONS = ("command", "json")


def config_from_args(argv: Sequence[str]) -> TrainConfig:
    """The checked `TrainConfig` of `mdtrain train ARGV`, as the command builds it.

    The one conversion from the command line to a run's configuration, so that an
    option means the same in the command, the benchmarks and a fault drill's chief
    script; display options (`--json`) are left out.

    Args:
        argv: the arguments after `mdtrain train`, e.g. `["--epochs", "2"]`.

    Returns:
        A validated `TrainConfig`; unset options keep `TrainConfig`'s defaults.

    Raises:
        UsageError: for an unknown option or a bad value, in one line.

    Example:

    >>> config_from_args(["--epochs", "2", "--strategy", "cpu:2"]).epochs
    2
    """
    return _config_of(build_parser().parse_args(["train", *argv]))


def _config_of(args: argparse.Namespace) -> TrainConfig:
    options = vars(args)
    config_options = {name: options[name] for name in options if name not in _DISPLAY_OPTIONS}
    config = TrainConfig(**config_options)
    config.validate()  # bad input in one line, before TensorFlow starts
    return config


def run_train(args: argparse.Namespace) -> int:
    """`mdtrain train`: one `train(config)` of the parsed options; also a ps chief's run."""
    config = _config_of(args)
    import_tensorflow()
    from mdtrain.training import train

    result = train(config)
    if args.json and result.is_chief:  # one summary per job, not one per worker
        print(json.dumps(result.summary()), flush=True)
    return 0


def _run_launch(args) -> int:
    from mdtrain.launcher import launch

    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    if train_args[:1] == ["train"]:  # `-- train --data D` reads as naturally as `-- --data D`
        train_args = train_args[1:]
    return launch(
        args.workers,
        train_args,
        restarts=args.restarts,
        log_dir=args.log_dir,
        hang_timeout_s=args.hang_timeout,
        gpus_per_worker=args.gpus_per_worker,
        num_ps=args.ps,
    )


def _run_predict(args) -> int:
    from mdtrain.prediction import find_image_files

    find_image_files(args.paths)  # bad input: one line, before TensorFlow starts
    if args.model == "efficientnet-lite0" and args.weights == "imagenet":
        from mdtrain.lite0 import lite0_torch_file

        lite0_torch_file()  # says what to install when the weights package is missing
    import_tensorflow()
    from mdtrain.prediction import predict

    result = predict(
        args.paths,
        model_file=args.model_file,
        model=args.model,
        weights=args.weights,
        top=args.top,
        image_size=args.image_size,
    )
    for note in result.notes:
        print(f"mdtrain: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict()), flush=True)
    else:
        print(result.to_text())
    return 0


_COMMANDS = {
    "data": _run_data,
    "train": run_train,
    "launch": _run_launch,
    "predict": _run_predict,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `mdtrain` command on `argv` (default: `sys.argv[1:]`); returns its exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ chatter quiet
    try:
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UsageError as error:
        print(f"mdtrain: error: {error.as_option()}", file=sys.stderr)
        return USAGE_EXIT_CODE
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in ("tensorflow", "keras"):
            print(
                "mdtrain: error: TensorFlow is not installed; install mdtrain[cpu] or "
                "mdtrain[gpu] (on Kaggle/Colab it is already there)",
                file=sys.stderr,
            )
            return USAGE_EXIT_CODE
        raise
    except KeyboardInterrupt:
        print("mdtrain: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        lost = _lost_peer(error)
        if lost is None:
            raise
        print(f"mdtrain: error: {lost}", file=sys.stderr)
        return 1


def _lost_peer(error: Exception) -> str | None:
    """One line for a collective aborted because another worker went away, else None."""
    # The launcher restarts or stops the job: the other workers' tracebacks say nothing new.
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(error, tf.errors.UnavailableError):
        return None
    lines = [line.strip() for line in str(error.message).splitlines() if line.strip()]
    reason = next((line for line in lines if "aborted by" in line), lines[-1] if lines else "")
    return f"lost contact with another worker ({reason})"
