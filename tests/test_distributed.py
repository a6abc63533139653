"""finetune and qat on tf.distribute, on this CPU-only host: MirroredStrategy
over two logical CPU devices (the strategy a 2-GPU machine gets), and two
worker processes on localhost with TF_CONFIG (MultiWorkerMirroredStrategy).
Each runs in a fresh process: logical devices and collective ops are set up
before TensorFlow runs its first op."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.test_detection_data import make_detection_folder

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))


def image_folder(root: Path, per_class: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index, name in enumerate(("ants", "bees")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                pixels = rng.integers(0, 80, (40, 48, 3)).astype(np.uint8)
                pixels[..., index] += 150
                Image.fromarray(pixels).save(folder / f"{j}.png")
    return root


def python(script: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=QUIET)


TWO_CPUS = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
"""

# The CLI on a MirroredStrategy over the two logical CPUs: what strategy_for_environment returns on a 2-GPU host.
MIRRORED_CLI = TWO_CPUS + """
import json, sys
from click.testing import CliRunner
from edgevit.cli import main
from edgevit.train import distribute
distribute.strategy_for_environment = lambda timeout: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
result = CliRunner().invoke(main, sys.argv[1:])
sys.stderr.write(result.stderr)
if result.exc_info and not isinstance(result.exception, SystemExit):
    import traceback
    traceback.print_exception(*result.exc_info)
print(result.stdout)
sys.exit(result.exit_code)
"""


@pytest.mark.slow  # 8 min on 2 cores (a QAT step is traced once per replica); the next test steps both on 2 replicas
def test_finetune_and_qat_train_on_two_replicas_and_the_models_load_and_evaluate(tmp_path):
    data = image_folder(tmp_path / "data")
    common = ["--input-size", "32", "--data", str(data), "--epochs", "1", "--steps-per-epoch", "2",
              "--batch-size", "8", "--json"]
    runs = {}
    for command, model, output in (("finetune", "mobilevit_v3_xxs", "m.keras"), ("qat", "m.keras", "q.keras")):
        proc = subprocess.run([sys.executable, "-c", MIRRORED_CLI, command, model, *common, "-o", output],
                              cwd=tmp_path, capture_output=True, text=True, timeout=900, env=QUIET)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[command] = json.loads(proc.stdout)
        assert runs[command]["replicas"] == 2 and runs[command]["history"][0]["images"] == 16
    for output in ("m.keras", "q.keras"):
        proc = subprocess.run([sys.executable, "-m", "edgevit", "eval", output, "--data", str(data), "--json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600, env=QUIET)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout)["images"] == 16


# One step of a model with BatchNorm and of its QAT model on the same global batch of 8, on one device and on
# two replicas (4 images each; the first replica's values are small, the second's large, as in issue 48).
SAME_GLOBAL_BATCH = TWO_CPUS + """
import json
import keras
import numpy as np
from edgevit.export.convert import convert
from edgevit.litert.flatbuffer import read
from edgevit.quantize.qat import quantization_ranges, quantize_model
from edgevit.registry import Preprocessing
from edgevit.train.distribute import synchronised_batchnorm
from edgevit.train.loop import TrainConfig, Trainer

def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3), name="image")
    # (a bias before BatchNorm has no gradient, and Adam's step turns its rounding noise into whole steps)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = keras.layers.Activation("relu", name="relu")(keras.layers.BatchNormalization(name="norm")(x))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x), name="tiny")

x = np.concatenate([np.full((4, 16, 16, 3), 0.1, np.float32), np.full((4, 16, 16, 3), 1.0, np.float32)])
x = x * np.random.default_rng(0).random(x.shape, dtype=np.float32)
y = np.asarray([0, 1] * 4, np.int64)
unscaled = Preprocessing(16, 16, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # the step's normalisation: x * 255 / 255
result = {}
try:
    Trainer(model(), None, 16, TrainConfig(batch_size=7), tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
except Exception as err:
    result["odd_batch"] = str(err)
for name, strategy in (("one", tf.distribute.get_strategy()),
                       ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    with strategy.scope():
        float_model = model()
        qat = quantize_model(model(), input_range=(0.0, 1.0))
    for kind, trained in (("float", float_model), ("qat", qat)):
        trainer = Trainer(trained, None, 16, TrainConfig(batch_size=8, lr=1e-3), strategy, log=lambda m: None)
        batches = strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.from_tensor_slices((x * 255, y, np.ones(8, bool))).batch(
                4 if name == "two" else 8))
        with synchronised_batchnorm(strategy, trained):
            loss = trainer._step_fn(16, batches.element_spec, unscaled)(*next(iter(batches)))[0]
        result[f"{name}.{kind}.loss"] = float(loss)
        result[f"{name}.{kind}.weights"] = [w.tolist() for w in trained.get_weights()]
        if name == "two":  # every replica holds the same values
            result[f"{name}.{kind}.replicas_equal"] = all(
                np.array_equal(*[np.asarray(v) for v in w.value.values]) for w in trained.weights)
    ranges = quantization_ranges(qat)
    result[f"{name}.ranges"] = {k: list(map(float, v)) for k, v in ranges.items()}
    plain = quantize_model(model(), input_range=(0.0, 1.0))
    plain.set_weights(qat.get_weights())
    graph = read(convert(plain, "int8", None, "int8"))
    result[f"{name}.params"] = sorted((t.name, t.scale, t.zero_point) for t in graph.tensors if t.scale is not None)
print(json.dumps(result))
"""


def test_the_same_global_batch_gives_the_same_step_on_one_and_on_two_replicas(tmp_path):
    """BatchNorm statistics are the global batch's on every replica, QAT
    ranges follow the global batch's min and max (not the mean of each
    replica's: [0, 5.5] for a [0, 10] batch), and the two QAT models convert
    to int8 files with the same quantization parameters."""
    proc = python(SAME_GLOBAL_BATCH, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("float", "qat"):
        assert result[f"two.{kind}.replicas_equal"], kind
        assert result[f"two.{kind}.loss"] == pytest.approx(result[f"one.{kind}.loss"], rel=1e-5)
        for index, (one, two) in enumerate(zip(result[f"one.{kind}.weights"], result[f"two.{kind}.weights"])):
            np.testing.assert_allclose(two, one, rtol=1e-4, atol=1e-6, err_msg=f"{kind} weight {index}")
    assert result["one.ranges"].keys() == result["two.ranges"].keys()
    for name, (lo, hi) in result["one.ranges"].items():
        assert result["two.ranges"][name] == pytest.approx([lo, hi], rel=1e-6), name
    assert result["one.params"] == result["two.params"]
    assert result["odd_batch"] == ("--batch-size 7 does not split evenly over the 2 replicas that train together: "
                                   "pass a multiple of 2.")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def workers(tmp_path: Path, args: list[str], count: int = 2, start: int | None = None, script: str | None = None):
    """``count`` edgevit processes of one TF_CONFIG cluster (only the first
    ``start`` of them started), each in its own folder; with ``script``,
    Python processes running it with ``args``."""
    addresses = [f"localhost:{port}" for port in free_ports(count)]
    procs = []
    for index in range(count if start is None else start):
        folder = tmp_path / f"worker{index}"
        folder.mkdir(exist_ok=True)  # a restart runs in the same folders
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        program = ["-m", "edgevit"] if script is None else ["-c", script]
        procs.append(subprocess.Popen([sys.executable, *program, *args], cwd=folder, text=True,
                                      env=dict(QUIET, TF_CONFIG=json.dumps(config)), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    return procs


def test_two_workers_train_alike_and_only_the_chief_writes(tmp_path):
    data = image_folder(tmp_path / "data")
    procs = workers(tmp_path, ["finetune", "mobilevit_v3_xxs", "--input-size", "32", "--data", str(data),
                               "--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "8", "-o", "m.keras"])
    outputs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    losses = [re.findall(r"epoch 1/1: loss ([0-9.]+).*val_top1 ([0-9.]+)", " ".join(err.split()))
              for _, err in outputs]
    assert len(losses[0]) == 1 and losses[0] == losses[1]
    assert (tmp_path / "worker0" / "m.keras").exists() and "workers" in outputs[0][0]
    assert list((tmp_path / "worker1").iterdir()) == []  # the other worker wrote nothing
    assert "the chief writes m.keras" in outputs[1][1]


def test_a_worker_that_never_comes_up_ends_the_run_with_one_error_line(tmp_path):
    data = image_folder(tmp_path / "data", per_class=2)
    started = time.perf_counter()
    (proc,) = workers(tmp_path, ["finetune", "mobilevit_v3_xxs", "--input-size", "32", "--data", str(data),
                                 "--worker-timeout", "5", "-o", "m.keras"], start=1)
    _, err = proc.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(lines) == 1, err[-3000:]
    assert "did not start: not every worker of the cluster" in lines[0] and "within 5 s" in lines[0]
    assert time.perf_counter() - started < 120 and "Traceback" not in err
    assert list((tmp_path / "worker0").iterdir()) == []


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_ends_the_others_and_a_restart_resumes(tmp_path):
    data = image_folder(tmp_path / "data", per_class=32)
    args = ["finetune", "mobilevit_v3_xxs", "--input-size", "32", "--data", str(data), "--epochs", "3",
            "--steps-per-epoch", "40", "--batch-size", "8", "-o", "m.keras"]
    procs = workers(tmp_path, args)
    seen = ""
    while "> epoch 1/3: loss" not in seen:  # the epoch's result, not a progress line of it
        line = procs[0].stderr.readline()
        assert line, "the chief ended before its first epoch"
        seen += line
    time.sleep(3)  # into the second epoch
    procs[1].kill()
    killed = time.perf_counter()
    _, err = procs[0].communicate(timeout=300)
    procs[1].communicate()
    assert procs[0].returncode == 1, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: Training across workers (TF_CONFIG) stopped: a worker "
                                                   "did not answer"), err[-3000:]
    assert time.perf_counter() - killed < 120
    state = json.loads((tmp_path / "worker0" / "m.keras.ckpt" / "state.json").read_text())
    assert state["epochs_done"] == 1
    procs = workers(tmp_path, args)  # every worker started again
    outputs = [proc.communicate(timeout=900) for proc in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    assert "Resuming from m.keras.ckpt: 1 epoch(s) done" in outputs[0][1]
    assert "epoch 1/3" not in outputs[0][1] and "epoch 3/3" in outputs[0][1]
    assert (tmp_path / "worker0" / "m.keras").exists() and not (tmp_path / "worker1" / "m.keras").exists()


def test_a_detectors_loss_and_counts_over_two_replicas_add_up_to_those_of_their_global_batch():
    """What a detector's step and validation sum across replicas (loss,
    matched anchors, anchors classified right) is per image: matching and
    the hard negatives (3 per matched anchor, chosen within each image),
    so the halves of a global batch add up to the whole's, and the loss,
    divided by the matched anchors of every replica, does not depend on
    the number of replicas. Images with one to three boxes padded to
    MAX_BOXES rows, one image without a box, one place without an image."""
    import tensorflow as tf

    from edgevit.data.boxes import MAX_BOXES
    from edgevit.train.objectives import Detection

    rng = np.random.default_rng(0)
    grid = (np.arange(6) + 0.5) / 6
    anchors = np.asarray([(y, x, s, s) for y in grid for x in grid for s in (0.2, 0.4)], np.float32)
    targets = np.zeros((6, MAX_BOXES, 5), np.float32)
    for image, count in enumerate((1, 3, 0, 2, 1, 2)):
        for row in range(count):
            top, left = rng.uniform(0, 0.6, 2)
            side = rng.uniform(0.15, 0.4)
            targets[image, row] = (top, left, top + side, left + side, 1 + (image + row) % 2)
    outputs = (tf.constant(rng.normal(size=(6, len(anchors), 4)), tf.float32),
               tf.constant(rng.normal(size=(6, len(anchors), 3)), tf.float32))
    real = np.asarray([True] * 5 + [False])
    objective = Detection(3, anchors)

    def sums(part):
        y = tf.constant(targets[part])
        return np.asarray([objective.loss_sum([o[part] for o in outputs], y), objective.units(y),
                           objective.hits([o[part] for o in outputs], y),
                           *objective.counts([o[part] for o in outputs], y, real[part])])

    whole, halves = sums(slice(0, 6)), sums(slice(0, 3)) + sums(slice(3, 6))
    np.testing.assert_allclose(halves, whole, rtol=1e-6)
    assert whole[1] > 8 and whole[4] < whole[1]  # the place without an image adds no matched anchor


# One step of the detector on the same global batch of 8 images (one to three boxes each, padded to MAX_BOXES
# rows) on one device and on two replicas of 4 images.
DETECTOR_STEP = TWO_CPUS + """
import json
import keras
import numpy as np
from edgevit.data.boxes import MAX_BOXES
from edgevit.registry import Preprocessing, create_model
from edgevit.train.distribute import synchronised_batchnorm
from edgevit.train.loop import TrainConfig, Trainer

SIZE = 64
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (8, SIZE, SIZE, 3)).astype(np.uint8)
y = np.zeros((8, MAX_BOXES, 5), np.float32)
for image in range(8):
    for row in range(image % 3 + 1):
        top, left = rng.uniform(0, 0.5, 2)
        side = rng.uniform(0.2, 0.5)
        y[image, row] = (top, left, top + side, left + side, 1 + (image + row) % 2)
unscaled = Preprocessing(SIZE, SIZE, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
result = {}
for name, strategy in (("one", tf.distribute.get_strategy()),
                       ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = create_model("ssdlite_mobilevit_v1_xxs", num_classes=3, input_size=SIZE)
    trainer = Trainer(model, None, SIZE, TrainConfig(batch_size=8, lr=1e-3), strategy, log=lambda m: None)
    batches = strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.from_tensor_slices((x, y, np.ones(8, bool))).batch(4 if name == "two" else 8))
    with synchronised_batchnorm(strategy, model):
        loss, right, matched, images = trainer._step_fn(SIZE, batches.element_spec, unscaled)(*next(iter(batches)))
    result[name] = [float(loss), float(right), float(matched), float(images)]
    # after one step, Adam's first moments are a tenth of the gradients (its step hides their size)
    np.savez(f"{name}.npz", *[v for v in trainer.optimizer.variables if v.path.endswith("_momentum")],
             *model.non_trainable_weights)
    if name == "two":
        result["replicas_equal"] = all(np.array_equal(*[np.asarray(v) for v in w.value.values])
                                       for w in model.weights)
print(json.dumps(result))
"""


@pytest.mark.slow  # 6 to 10 min on the shared 2-core host: the step is traced on one device, then once per replica
def test_a_detectors_step_on_two_replicas_is_its_step_on_one_device(tmp_path):
    """The loss, the matched anchors and those classified right, the
    gradients and the BatchNorm statistics of one step of the detector on
    the same global batch, on one device and on two replicas."""
    proc = python(DETECTOR_STEP, tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas_equal"]
    assert result["two"] == pytest.approx(result["one"], rel=1e-5) and result["one"][3] == 8
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert len(one.files) == len(two.files) > 100
    # each array to 2e-4 of its largest value (found: 5e-5 at most); those that are 0 but for rounding (a bias
    # before BatchNorm has no gradient) to 2e-4 of a thousandth of the largest value of all
    largest = max(float(np.abs(one[name]).max()) for name in one.files)
    for name in one.files:
        scale = max(float(np.abs(one[name]).max()), 1e-3 * largest)
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=2e-4 * scale, err_msg=name)


# The Trainer on a detection folder, each epoch one step of 8 images, validated on 8: across the workers of
# TF_CONFIG, or on one device without it; every run starts from the same weights (seeded; the chief's).
DETECTOR_RUN = """
import hashlib, json, sys
from edgevit.train.distribute import strategy_for_environment
strategy = strategy_for_environment()  # before TensorFlow runs an op
import keras
import numpy as np
from edgevit.data.boxes import find_detection_dataset
from edgevit.data.stream import ImageStream
from edgevit.registry import create_model, get_spec
from edgevit.train.loop import TrainConfig, Trainer
from edgevit.train.validation import Validation

data, epochs = sys.argv[1], int(sys.argv[2])
dataset = find_detection_dataset(data)
keras.utils.set_random_seed(0)
with strategy.scope():
    model = create_model("ssdlite_mobilevit_v1_xxs", num_classes=len(dataset.classes), input_size=64)
pre = get_spec(model.name).preprocessing_at(64)
config = TrainConfig(epochs=epochs, batch_size=8, steps_per_epoch=1, checkpoint_dir="ckpt")
trainer = Trainer(model, None, 64, config, strategy, log=lambda line: print(line, file=sys.stderr))
history = trainer.fit(ImageStream(dataset.train, pre), Validation(ImageStream(dataset.val, pre), 64, strategy))
weights = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.weights)).hexdigest()
print(json.dumps({"history": [{k: v for k, v in h.items() if k != "seconds"} for h in history], "weights": weights}))
"""


def finished(proc: subprocess.Popen) -> tuple[dict, str]:
    """(the JSON line a DETECTOR_RUN process printed last, what it logged)."""
    out, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.slow  # 18 min on the 2-core host shared with other runs (2026-11-29): five processes trace a step
def test_two_workers_train_a_detector_as_one_device_does_and_resume_it_where_it_stopped(tmp_path):
    """Two TF_CONFIG workers train the detector one epoch: they end with
    the same weights, and their loss, validation loss and anchor
    accuracies are those of one device on the same images; started again
    for two epochs, the chief resumes from its checkpoint and the workers
    train the second epoch alone, as one device training both does."""
    data = make_detection_folder(tmp_path / "shapes", per_split=8)
    (first, _), (other, _) = (finished(p) for p in workers(tmp_path, [str(data), "1"], script=DETECTOR_RUN))
    assert first == other and [h["images"] for h in first["history"]] == [8]
    assert (tmp_path / "worker0" / "ckpt" / "state.json").exists() and not (tmp_path / "worker1" / "ckpt").exists()
    (resumed, log), (other, _) = (finished(p) for p in workers(tmp_path, [str(data), "2"], script=DETECTOR_RUN))
    assert resumed["weights"] == other["weights"] and resumed["weights"] != first["weights"]
    assert "Resuming from ckpt: 1 epoch(s) done" in log and "epoch 1/2" not in log and "epoch 2/2" in log
    assert resumed["history"][0] == first["history"][0] and other["history"] == resumed["history"][1:]
    (tmp_path / "alone").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", DETECTOR_RUN, str(data), "2"], cwd=tmp_path / "alone", text=True,
                            env=QUIET, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    alone, _ = finished(proc)
    # The first loss is of the same weights; after that, Adam's step turns the rounding noise of gradients near 0
    # into whole steps of the learning rate (one device and two workers: val_loss 37.5876 and 37.5811 after 2 steps)
    assert resumed["history"][0]["loss"] == pytest.approx(alone["history"][0]["loss"], rel=1e-5)
    for mine, its in zip(resumed["history"], alone["history"]):
        assert mine.keys() == its.keys() and mine["images"] == its["images"] == 8
        for key in ("loss", "train_anchor_accuracy", "val_loss", "val_anchor_accuracy"):
            assert mine[key] == pytest.approx(its[key], rel=1e-3), (mine["epoch"], key)
