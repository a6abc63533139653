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


def workers(tmp_path: Path, args: list[str], count: int = 2, start: int | None = None):
    """``count`` edgevit processes of one TF_CONFIG cluster (only the first
    ``start`` of them started), each in its own folder."""
    addresses = [f"localhost:{port}" for port in free_ports(count)]
    procs = []
    for index in range(count if start is None else start):
        folder = tmp_path / f"worker{index}"
        folder.mkdir(exist_ok=True)  # a restart runs in the same folders
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        procs.append(subprocess.Popen([sys.executable, "-m", "edgevit", *args], cwd=folder, text=True,
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
