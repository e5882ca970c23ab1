"""The GPU code paths, exercised without a GPU.

- GPU memory growth is set on every GPU before anything initialises the devices
  (`configure_devices` against a fake `tf.config` that fails as TensorFlow does
  once devices are initialised);
- mixed precision follows the strategy's own devices (fake T4, V100, A100, H100,
  TPU, mixed machines; this machine's CPUs), is given to the model, not set
  globally, and both policies really train here (float16 with loss scaling);
- `--deterministic` refuses, before training, a model with an op TensorFlow
  cannot make deterministic (a real one on the CPU, and a GPU one's error);
- the NVML reader and the sampler over a fake `pynvml` that answers as the
  real one does on Kaggle's 2×T4 (bytes names from old releases, a query a
  board does not support, `CUDA_VISIBLE_DEVICES` from `mdtrain launch`).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from mdtrain.errors import UsageError
from mdtrain.gpus import worker_devices
from mdtrain.monitor import Sampler
from mdtrain.monitor.sampler import NvmlReader
from mdtrain.precision import choose_policy

# --- memory growth ---------------------------------------------------------------


class FakeTfConfig:
    """`tf.config` as far as `configure_devices` uses it, with TensorFlow's ordering rule."""

    def __init__(self, num_gpus: int):
        self.gpus = [f"PhysicalDevice(GPU:{i})" for i in range(num_gpus)]
        self.calls: list[tuple] = []
        self.initialised = False
        self.experimental = types.SimpleNamespace(set_memory_growth=self._set_memory_growth)
        self.LogicalDeviceConfiguration = lambda: "virtual"
        self.threading = types.SimpleNamespace(  # CPU replicas' share of the cores
            get_intra_op_parallelism_threads=lambda: 0,
            set_intra_op_parallelism_threads=lambda n: self.calls.append(("intra-op", n)),
        )

    def _refuse_after_init(self, what: str) -> None:
        if self.initialised:  # TensorFlow's own message for the same mistake
            raise RuntimeError(f"{what} cannot be modified after being initialized")

    def list_physical_devices(self, kind: str):  # does not initialise devices
        self.calls.append(("physical", kind))
        return list(self.gpus) if kind == "GPU" else ["PhysicalDevice(CPU:0)"]

    def _set_memory_growth(self, device, enable: bool) -> None:
        if ("virtual", device, 2) in self.calls:  # TensorFlow's check, before the one below
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        self._refuse_after_init("Physical devices")
        self.calls.append(("growth", device, enable))

    def set_logical_device_configuration(self, device, configs) -> None:
        self._refuse_after_init("Virtual devices")
        self.calls.append(("virtual", device, len(configs)))

    def list_logical_devices(self, kind: str | None = None):  # initialises devices
        self.initialised = True
        self.calls.append(("logical", kind))
        return []


@pytest.fixture
def fake_tf(monkeypatch):
    distribute = pytest.importorskip("mdtrain.distribute")

    def make(num_gpus: int) -> FakeTfConfig:
        config = FakeTfConfig(num_gpus)
        monkeypatch.setattr(distribute, "tf", types.SimpleNamespace(config=config))
        return config

    return distribute, make


@pytest.mark.parametrize("strategy", ["auto", "mirrored", "multiworker", "one"])
def test_memory_growth_is_set_on_every_gpu_before_devices_initialise(fake_tf, strategy):
    distribute, make = fake_tf
    config = make(2)
    distribute.configure_devices(strategy)
    growth = [c for c in config.calls if c[0] == "growth"]
    assert growth == [("growth", gpu, True) for gpu in config.gpus]
    first_init = next((i for i, c in enumerate(config.calls) if c[0] == "logical"), None)
    last_growth = max(i for i, c in enumerate(config.calls) if c[0] == "growth")
    assert first_init is None or last_growth < first_init, config.calls


def test_memory_growth_then_virtual_cpus_on_a_gpu_machine(fake_tf):
    distribute, make = fake_tf
    config = make(1)
    distribute.configure_devices("cpu:2")
    kinds = [c[0] for c in config.calls]
    assert kinds.index("growth") < kinds.index("virtual")
    assert ("virtual", "PhysicalDevice(CPU:0)", 2) in config.calls


def test_a_gpu_split_into_logical_gpus_keeps_its_limits(fake_tf):
    # One card as two logical GPUs (benchmarks/gpu.py, notebooks on one GPU): TensorFlow
    # refuses memory growth on it with a ValueError; the other GPUs still get growth.
    distribute, make = fake_tf
    config = make(2)
    config.set_logical_device_configuration(config.gpus[0], ["virtual", "virtual"])
    distribute.configure_devices("mirrored")
    assert [c for c in config.calls if c[0] == "growth"] == [("growth", config.gpus[1], True)]
    with pytest.raises(ValueError, match="virtual devices configured"):  # the fake can fail
        config.experimental.set_memory_growth(config.gpus[0], True)


def test_the_fake_refuses_growth_after_init_as_tensorflow_does(fake_tf):
    # Proves the ordering test above can fail: growth after initialisation is refused.
    _, make = fake_tf
    config = make(1)
    config.list_logical_devices("GPU")
    with pytest.raises(RuntimeError, match="after being initialized"):
        config.experimental.set_memory_growth(config.gpus[0], True)


# --- which strategy `make_strategy` makes on 0, 1 and 2 GPUs, a TPU, or 1 CPU ---------------


@pytest.fixture
def fake_strategies(monkeypatch):
    """`make_strategy` against a fake `tf` that records the strategy it would make."""
    distribute = pytest.importorskip("mdtrain.distribute")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(distribute, "fresh_collective_keys", lambda: None)

    def make(gpus: int, cpus: int, tpu: bool = False, cards: int | None = None):
        listed = []

        def list_logical_devices(kind):
            listed.append(kind)
            return [f"{kind}:{i}" for i in range(gpus if kind == "GPU" else cpus)]

        def strategy(kind):
            return lambda *args, **kwargs: (kind, *args, *kwargs.values())

        def list_physical_devices(kind):  # `cards` GPUs split into `gpus` logical ones
            return [f"{kind}:{i}" for i in range(gpus if cards is None else cards)]

        monkeypatch.setattr(distribute, "_tpu_available", lambda: tpu)
        monkeypatch.setattr(distribute, "tf", types.SimpleNamespace(
            config=types.SimpleNamespace(list_logical_devices=list_logical_devices,
                                         list_physical_devices=list_physical_devices,
                                         experimental_connect_to_cluster=lambda resolver: None),
            tpu=types.SimpleNamespace(experimental=types.SimpleNamespace(
                initialize_tpu_system=lambda resolver: None)),
            distribute=types.SimpleNamespace(
                MirroredStrategy=strategy("mirrored"), OneDeviceStrategy=strategy("one"),
                TPUStrategy=strategy("tpu"), ReductionToOneDevice=lambda: "to-one-device",
                cluster_resolver=types.SimpleNamespace(TPUClusterResolver=lambda: "resolver")),
        ))  # fmt: skip
        return distribute.make_strategy, listed

    return make


@pytest.mark.parametrize(
    ("name", "gpus", "cpus", "tpu", "made"),
    [
        ("auto", 0, 4, False, ("mirrored", [f"/cpu:{i}" for i in range(4)])),  # laptop
        ("auto", 1, 1, False, ("mirrored",)),  # Colab
        ("auto", 2, 1, False, ("mirrored",)),  # Kaggle 2xT4
        ("auto", 0, 1, True, ("tpu", "resolver")),
        ("mirrored", 0, 1, False, ("mirrored",)),
        ("one", 1, 1, False, ("one", "/gpu:0")),
        ("one", 0, 1, False, ("one", "/cpu:0")),
        ("cpu:2", 1, 2, False, ("mirrored", ["/cpu:0", "/cpu:1"])),
    ],
)
def test_make_strategy_uses_the_devices_there_are(fake_strategies, name, gpus, cpus, tpu, made):
    make_strategy, _ = fake_strategies(gpus, cpus, tpu)
    assert make_strategy(name) == made


@pytest.mark.parametrize(
    ("name", "gpus", "cpus", "tpu", "words"),
    [
        ("auto", 0, 1, False, "only 1 CPU device"),  # virtual CPUs were not configured
        ("tpu", 2, 1, False, "no TPU found"),
        ("cpu:4", 0, 2, False, "only 2 CPU device"),
        ("multiworker", 0, 1, False, "needs a cluster"),
    ],
)
def test_make_strategy_says_what_is_missing_in_one_line(fake_strategies, name, gpus, cpus, tpu,
                                                        words):  # fmt: skip
    make_strategy, listed = fake_strategies(gpus, cpus, tpu)
    with pytest.raises(UsageError, match=words) as raised:
        make_strategy(name)
    assert "\n" not in str(raised.value)
    if name == "multiworker":  # before anything starts TensorFlow's runtime
        assert listed == []


def test_logical_gpus_of_one_card_are_not_reduced_with_nccl(fake_strategies):
    make_strategy, _ = fake_strategies(gpus=2, cpus=1, cards=1)  # one H100 split in two
    assert make_strategy("mirrored") == ("mirrored", "to-one-device")


# --- mixed precision: the strategy's own devices decide ----------------------------------

T4 = {"device_name": "Tesla T4", "compute_capability": (7, 5)}
V100 = {"device_name": "Tesla V100-SXM2-16GB", "compute_capability": (7, 0)}
A100 = {"device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": (8, 0)}
H100 = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}


@pytest.fixture
def fake_gpus(monkeypatch):
    """`strategy_devices` on a machine whose GPUs are `cards` (TensorFlow's device details)."""
    tf = pytest.importorskip("tensorflow")
    from mdtrain.precision import strategy_devices

    def devices_of(cards, replicas, virtual=None):
        physical = [f"PhysicalDevice(GPU:{i})" for i in range(len(cards))]
        config = tf.config
        monkeypatch.setattr(config, "get_visible_devices", lambda kind: physical)
        monkeypatch.setattr(config, "get_logical_device_configuration",
                            lambda gpu: (virtual or {}).get(gpu))  # fmt: skip
        monkeypatch.setattr(config.experimental, "get_device_details",
                            lambda gpu: cards[physical.index(gpu)])  # fmt: skip
        names = [f"/job:localhost/replica:0/task:0/device:{r}" for r in replicas]
        return strategy_devices(types.SimpleNamespace(extended=types.SimpleNamespace(
            worker_devices=tuple(names))))  # fmt: skip

    return devices_of


@pytest.mark.parametrize(
    ("gpus", "implementation"),
    [(["PhysicalDevice(GPU:0)"], "NCCL"), (["GPU:0", "GPU:1"], "NCCL"), ([], "RING")],
)
def test_multiworker_collectives_are_nccl_between_gpu_workers(monkeypatch, gpus, implementation):
    import json

    import tensorflow as tf

    from mdtrain import distribute

    made = {}
    cluster = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
               "task": {"type": "worker", "index": 0}}  # fmt: skip
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: list(gpus) if kind == "GPU" else ["CPU:0"])  # fmt: skip
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy",
                        lambda **kwargs: made.update(kwargs) or "made")  # fmt: skip
    assert distribute.make_strategy("multiworker") == "made"
    chosen = made["communication_options"].implementation
    assert chosen == getattr(tf.distribute.experimental.CommunicationImplementation, implementation)
    assert made["cluster_resolver"].task_id == 0


# --- mixed precision ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cards", "replicas", "policy", "line"),
    [
        ([T4, T4], ["GPU:0", "GPU:1"], "mixed_float16",  # Kaggle's 2xT4
         "mixed precision: float16 with loss scaling (Tesla T4, compute capability 7.5)"),
        ([V100], ["GPU:0"], "mixed_float16", "(Tesla V100-SXM2-16GB, compute capability 7.0)"),
        ([A100], ["GPU:0"], "mixed_bfloat16",
         "mixed precision: bfloat16 (NVIDIA A100-SXM4-40GB, compute capability 8.0)"),
        ([H100], ["GPU:0"], "mixed_bfloat16",
         "mixed precision: bfloat16 (NVIDIA H100 80GB HBM3, compute capability 9.0)"),
        ([T4, T4], ["CPU:0", "CPU:1"], "mixed_bfloat16", "mixed precision: bfloat16 (CPU)"),
        ([], ["TPU:0", "TPU:1"], "mixed_bfloat16", "mixed precision: bfloat16 (TPU)"),
        # The weakest device decides: a T4 beside an A100 has no bfloat16 tensor cores.
        ([A100, T4], ["GPU:0", "GPU:1"], "mixed_float16", "(NVIDIA A100-SXM4-40GB, compute "
         "capability 8.0; Tesla T4, compute capability 7.5)"),
        # Only the strategy's devices count: the second card is not one of its replicas.
        ([A100, T4], ["GPU:0"], "mixed_bfloat16", "(NVIDIA A100-SXM4-40GB, compute "
         "capability 8.0)"),
        ([T4], ["CPU:0", "GPU:0"], "float32", "mixed precision: off, float32 (CPU; Tesla T4"),
    ],
)  # fmt: skip
def test_the_policy_follows_the_strategys_devices(fake_gpus, cards, replicas, policy, line):
    from mdtrain.precision import describe_policy

    devices = fake_gpus(cards, replicas)
    assert choose_policy(True, devices) == policy
    assert choose_policy(False, devices) == "float32"
    assert line in describe_policy(policy, devices)


def test_two_logical_gpus_of_one_card_are_that_card(fake_gpus):
    devices = fake_gpus([A100, T4], ["GPU:0", "GPU:1", "GPU:2"],
                        virtual={"PhysicalDevice(GPU:0)": ["half", "half"]})  # fmt: skip
    assert [d.name for d in devices] == ["NVIDIA A100-SXM4-40GB"] * 2 + ["Tesla T4"]


def test_a_real_cpu_strategy_is_bfloat16():
    tf = pytest.importorskip("tensorflow")
    from mdtrain.precision import describe_policy, strategy_devices

    devices = strategy_devices(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    assert describe_policy(choose_policy(True, devices), devices) == (
        "mixed precision: bfloat16 (CPU)"
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_each_policy_trains_a_step(policy):
    """What a T4 and what this machine get, each trains for real here (TensorFlow runs both).

    Given the float16 policy, the trainer's `compile` scales the loss (a `LossScaleOptimizer`);
    bfloat16 needs none."""
    keras = pytest.importorskip("keras")
    from mdtrain.loop import ExactTrainer
    from mdtrain.models import build_model

    trainer = ExactTrainer(build_model("small-cnn", 2, 16, dtype=policy), dtype=policy)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    scaled = isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (8, 16, 16, 3), "uint8"), np.arange(8) % 2
    before = [w.copy() for w in trainer.net.get_weights()]
    # Dynamic loss scaling starts at 2**15 and skips a step whose float16
    # gradients overflow, halving the scale; a few steps always get through.
    history = trainer.fit(images, labels, batch_size=4, epochs=4, verbose=0).history
    compute = "float16" if policy == "mixed_float16" else "bfloat16"
    assert trainer.net.get_layer("conv0").compute_dtype == compute
    assert all(w.dtype == "float32" for w in trainer.net.weights)  # variables stay float32
    assert np.isfinite(history["loss"]).all()
    after = trainer.net.get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert keras.config.dtype_policy().name == "float32"  # given to the model, not global


@pytest.mark.slow
def test_train_gives_the_policy_to_the_model_and_leaves_keras_global_alone(tiny_dataset):
    keras = pytest.importorskip("keras")
    from mdtrain.training import TrainConfig, train

    before = keras.config.dtype_policy().name
    result = train(TrainConfig(data=str(tiny_dataset), epochs=1, strategy="cpu:2",
                               mixed_precision=True, global_batch_size=8, monitor="none",
                               verbose=0))  # fmt: skip
    assert keras.config.dtype_policy().name == before == "float32"
    assert result.summary()["precision"] == "mixed_bfloat16"
    net = result.model
    conv = keras.Model(net.input, net.get_layer("conv1").output)
    assert keras.backend.standardize_dtype(conv(np.zeros((1, 32, 32, 3), "uint8")).dtype) == (
        "bfloat16"
    )
    assert net.get_layer("probabilities").compute_dtype == "float32"
    assert all(w.dtype == "float32" for w in net.weights)


# --- --deterministic: what TensorFlow cannot make deterministic is refused before training --


def _two_cpus():
    """A `cpu:2` MirroredStrategy with its own collective keys (tensorflow/tensorflow#61314)."""
    tf = pytest.importorskip("tensorflow")
    from mdtrain.compat import fresh_collective_keys

    fresh_collective_keys()
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _probe_net(keras, layer, image_size: int = 8, num_classes: int = 2):
    """Convolution, exact BatchNormalization, `layer`, dropout, softmax: 0-255 images in."""
    from mdtrain.norm import ExactBatchNormalization

    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(2, 3)(keras.layers.Rescaling(1 / 255)(inputs))
    x = layer(ExactBatchNormalization()(x))
    x = keras.layers.Dropout(0.5)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def _clock():
    """A layer with an op TensorFlow refuses under determinism on a CPU too (`tf.timestamp`)."""
    keras, tf = pytest.importorskip("keras"), pytest.importorskip("tensorflow")

    class Clock(keras.layers.Layer):
        def call(self, x):
            return x + 0 * tf.cast(tf.timestamp(), x.dtype)

    return Clock()


def _gpu_only_gradient():
    """A layer whose gradient raises as a GPU's depthwise filter gradient does without cuDNN."""
    keras, tf = pytest.importorskip("keras"), pytest.importorskip("tensorflow")

    class DepthwiseOnGpu(keras.layers.Layer):
        def call(self, x):
            @tf.custom_gradient
            def identity(x):
                def gradient(dy):
                    op = "DepthwiseConv2dNativeBackpropFilter"
                    message = f"A deterministic GPU implementation of {op} is not currently "
                    raise tf.errors.UnimplementedError(
                        None, None, message + f"available. [Op:{op}]"
                    )

                return tf.identity(x), gradient

            return identity(x)

    return DepthwiseOnGpu()


@pytest.mark.parametrize(
    ("layer", "op"), [(_clock, "Timestamp"), (_gpu_only_gradient, "DepthwiseConv2dNative")]
)
def test_the_probe_refuses_what_tensorflow_cannot_make_deterministic(layer, op):
    keras = pytest.importorskip("keras")
    from mdtrain.compat import run_settings
    from mdtrain.precision import check_deterministic

    strategy = _two_cpus()
    with run_settings(deterministic=True), strategy.scope():
        net = _probe_net(keras, layer())
        with pytest.raises(UsageError, match=f"--deterministic: .*{op}.* drop --deterministic"):
            check_deterministic(strategy, net, 8, net.trainable_weights)


def test_the_probe_passes_a_plain_model_and_leaves_its_state_alone():
    keras = pytest.importorskip("keras")
    from mdtrain.compat import run_settings
    from mdtrain.precision import check_deterministic

    strategy = _two_cpus()
    with run_settings(deterministic=True), strategy.scope():
        net = _probe_net(keras, keras.layers.ReLU())
        before = [v.numpy().copy() for v in net.variables]
        check_deterministic(strategy, net, 8, net.weights)
    assert len(net.non_trainable_variables) == 3  # moving mean and variance, dropout's RNG
    for a, b in zip(before, net.variables, strict=True):
        np.testing.assert_array_equal(a, b.numpy())


@pytest.mark.slow
def test_deterministic_refuses_in_one_line_before_training(tiny_dataset, monkeypatch, capsys):
    keras = pytest.importorskip("keras")
    import mdtrain.parts
    from mdtrain.cli import main

    def build_model(name, num_classes, image_size, *args, **kwargs):
        return _probe_net(keras, _clock(), image_size, num_classes)

    monkeypatch.setattr(mdtrain.parts, "build_model", build_model)  # where the run calls it
    code = main(["train", "--data", str(tiny_dataset), "--epochs", "1", "--strategy", "cpu:2",
                 "--global-batch-size", "8", "--deterministic", "--monitor", "none"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and "Epoch" not in out
    assert err.startswith("mdtrain: error: --deterministic: TensorFlow cannot run Timestamp")
    assert err.count("\n") == 1


# --- NVML reader and sampler -----------------------------------------------------------


class FakeNvmlError(Exception):
    pass


def fake_pynvml(names=("Tesla T4", "Tesla T4"), no_power=(), init_error=None, calls=None,
                migs=None):  # fmt: skip
    """A `pynvml` module answering like nvidia-ml-py on the GPUs `names`.

    `migs` maps the UUID of each MIG device to the index of its GPU.
    """
    calls = [] if calls is None else calls
    uuids = [f"GPU-{i}{i}{i}-fake" for i in range(len(names))]

    def mig_handle(uuid: bytes):
        if uuid.decode() not in (migs or {}):
            raise FakeNvmlError("Not Found")
        return ("mig", migs[uuid.decode()])

    def init():
        calls.append("init")
        if init_error:
            raise FakeNvmlError(init_error)

    def power(handle):
        if handle in no_power:
            raise FakeNvmlError("Not Supported")
        return 27_500 + 1000 * handle  # milliwatts

    module = types.ModuleType("pynvml")
    module.NVML_TEMPERATURE_GPU = 0
    module.NVMLError = FakeNvmlError
    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(names)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetUUID = lambda h: uuids[h]
    module.nvmlDeviceGetHandleByUUID = mig_handle
    module.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda h: h[1]
    module.nvmlDeviceGetName = lambda h: names[h].encode()  # old releases return bytes
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h, memory=5)
    module.nvmlMemory_v2 = 0x2000028

    def memory(handle, version=None):
        # Like a real driver: the first query counts its 0.5 GiB reserve as used.
        reserved = 0 if version is not None else 2**29
        used = (1 + handle) * 2**30 + reserved
        return types.SimpleNamespace(used=used, total=15 * 2**30, free=15 * 2**30 - used)

    module.nvmlDeviceGetMemoryInfo = memory
    module.nvmlDeviceGetPowerUsage = power
    module.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h if sensor == 0 else None
    return module


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(**kwargs):
        module = fake_pynvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_reader_reads_every_gpu_in_watts_and_bytes(nvml):
    nvml()
    reader = NvmlReader()
    assert reader.error is None
    assert reader.names == ["GPU 0 (Tesla T4)", "GPU 1 (Tesla T4)"]
    gpu0, gpu1 = reader.read()
    assert (gpu0.kind, gpu0.utilization, gpu0.power_w, gpu0.temperature_c) == ("gpu", 40, 27.5, 60)
    assert (gpu1.memory_used, gpu1.memory_total) == (2 * 2**30, 15 * 2**30)
    reader.close()


def test_memory_used_leaves_out_the_drivers_reserve_as_nvidia_smi_does(nvml):
    nvml()
    reader = NvmlReader()
    assert [gpu.memory_used for gpu in reader.read()] == [2**30, 2 * 2**30]
    reader.close()


def test_an_nvml_release_without_the_second_memory_query_still_reports_memory(nvml):
    del nvml().nvmlMemory_v2
    reader = NvmlReader()
    assert reader.read()[0].memory_used == 2**30 + 2**29
    reader.close()


def test_a_query_the_board_cannot_answer_is_none_not_fatal(nvml):
    nvml(no_power=(1,))
    reader = NvmlReader()
    gpu0, gpu1 = reader.read()
    assert gpu0.power_w == 27.5 and gpu1.power_w is None and gpu1.utilization == 41
    reader.close()


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        ("1", ["GPU 1 (Tesla T4)"]),
        ("GPU-111", ["GPU 1 (Tesla T4)"]),
        ("1,0", None),
        ("0,5,1", ["GPU 0 (Tesla T4)"]),  # CUDA stops at the first invalid entry
    ],
)
def test_reader_shows_the_gpus_cuda_shows(nvml, monkeypatch, visible, names):
    nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    reader = NvmlReader()
    assert reader.names == (names or ["GPU 1 (Tesla T4)", "GPU 0 (Tesla T4)"])
    reader.close()


A100_MIGS = {"MIG-5c1d-fake": 1, "MIG-9e2f-fake": 1, "MIG-0a0a-fake": 0}


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        ("MIG-5c1d-fake", ["GPU 1 (A100)"]),  # a MIG device: the GPU it is part of
        ("MIG-GPU-111-fake/1/0", ["GPU 1 (A100)"]),  # the form of drivers before R470
        ("MIG-5c1d-fake,MIG-9e2f-fake", ["GPU 1 (A100)"]),  # two of one GPU: one row
        ("MIG-0a0a-fake,MIG-5c1d-fake", ["GPU 0 (A100)", "GPU 1 (A100)"]),
        ("MIG-0a0a-fake,MIG-dead-fake,1", ["GPU 0 (A100)"]),  # CUDA stops at an unknown one
    ],
)
def test_reader_shows_the_gpus_of_mig_devices(nvml, monkeypatch, visible, names):
    nvml(names=("A100", "A100"), migs=A100_MIGS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    reader = NvmlReader()
    assert reader.names == names
    reader.close()


def test_each_launched_worker_monitors_its_own_gpu(nvml, monkeypatch):
    nvml()
    for index, visible in enumerate(worker_devices(2, ["0", "1"]).cuda_visible_devices):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        reader = NvmlReader()
        assert reader.names == [f"GPU {index} (Tesla T4)"]
        reader.close()


def test_no_visible_gpu_is_an_error_not_an_exception(nvml, monkeypatch):
    nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    reader = NvmlReader()
    assert reader.error == "NVML found no visible NVIDIA GPU" and reader.read() == ()


def test_no_driver_is_an_error_not_an_exception(nvml):
    nvml(init_error="Driver Not Loaded")
    reader = NvmlReader()
    assert "Driver Not Loaded" in reader.error and reader.read() == () and reader.names == []
    reader.close()


def test_no_pynvml_is_an_error_not_an_exception(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reader = NvmlReader()
    assert reader.error.startswith("NVML unavailable (ModuleNotFoundError")


def test_close_shuts_nvml_down_once(nvml):
    calls = []
    nvml(calls=calls)
    reader = NvmlReader()
    reader.close()
    reader.close()
    assert calls == ["init", "shutdown"] and reader.read() == ()


def test_sampler_over_nvml_samples_gpus_then_the_cpu(nvml):
    nvml()
    with Sampler(0.05) as sampler:
        sample = sampler.sample_now()
    assert sampler.has_gpu
    assert [d.name for d in sample.devices] == ["GPU 0 (Tesla T4)", "GPU 1 (Tesla T4)", "CPU"]
    assert [g.utilization for g in sample.gpus] == [40, 41]
