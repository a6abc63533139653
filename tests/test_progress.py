"""Progress: live bars with the count and an estimate on a terminal, step
lines elsewhere, nothing where standard output is JSON; and what the long
steps of training and evaluation report through it."""
import io
import json
import re
import subprocess
import sys

import keras
import numpy as np

from edgevit.data.folders import Split
from edgevit.data.stream import ImageStream
from edgevit.progress import Progress
from edgevit.registry import Preprocessing
from edgevit.train.loop import TrainConfig, Trainer
from edgevit.train.prepare import val_metrics


class Terminal(io.StringIO):
    def isatty(self):
        return True

    def shown(self) -> str:
        """What was written, without the terminal's colour and cursor codes."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.getvalue())


def counted(progress: Progress) -> None:
    progress.step("Calibrating the [activation] ranges")
    with progress.bar("calibrating", 3, "batches") as advance:
        for _ in range(3):
            advance(status="loss 0.6931")


def test_a_bar_shows_the_count_time_and_estimate_on_a_terminal():
    stream = Terminal()
    counted(Progress(stream=stream))
    text = stream.shown()
    assert "> Calibrating the [activation] ranges" in text
    assert "calibrating" in text and "3/3 batches" in text and "left" in text and "loss 0.6931" in text


def test_off_a_terminal_only_the_step_lines_print_and_disabled_nothing():
    stream = io.StringIO()
    counted(Progress(stream=stream))
    assert stream.getvalue() == "> Calibrating the [activation] ranges\n"  # a bar shorter than a plain line's gap
    long = Progress(stream=io.StringIO())
    long.step("epoch 1/3: " + "loss 0.3925, " * 20)
    assert long._console.file.getvalue().count("\n") == 1  # one line in a log, not wrapped at 80 columns
    quiet = Terminal()
    counted(Progress(enabled=False, stream=quiet))
    assert quiet.getvalue() == ""


def test_off_a_terminal_a_long_bar_prints_plain_lines_of_its_state(monkeypatch):
    from edgevit import progress as module

    monkeypatch.setattr(module, "PLAIN_LINE_SECONDS", 0.0)
    stream = io.StringIO()
    counted(Progress(stream=stream))
    assert stream.getvalue().splitlines() == ["> Calibrating the [activation] ranges",
                                              *[f"  calibrating: {i}/3 batches, 0:00 spent, loss 0.6931"
                                                for i in (1, 2, 3)]]


def tiny_classifier(size=16):
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x), name="tiny")


def ants_and_bees(folder, count: int, size: int = 16) -> ImageStream:
    from PIL import Image

    rng = np.random.default_rng(0)
    labels = np.arange(count) % 2
    folder.mkdir()
    files = []
    for index, label in enumerate(labels):
        pixels = rng.integers(0, 255, (size, size, 3)).astype(np.uint8)
        pixels[..., 0] = 255 if label else pixels[..., 0]
        files.append(str(folder / f"{index}.png"))
        Image.fromarray(pixels).save(files[-1])
    return ImageStream(Split(files, labels), Preprocessing(size, size))


def test_training_shows_its_steps_and_traces_one_graph_for_a_smaller_last_batch(tmp_path):
    stream = Terminal()
    progress = Progress(stream=stream)
    trainer = Trainer(tiny_classifier(), None, 16, TrainConfig(epochs=1, batch_size=8), log=progress.step,
                      progress=progress)
    evaluate = val_metrics(ants_and_bees(tmp_path / "val", 10), 16, progress=progress)  # batches of 32: one of 10
    history = trainer.fit(ants_and_bees(tmp_path / "train", 20), evaluate)   # batches of 8, 8 and 4
    text = stream.shown()
    assert "epoch 1/1" in text and "3/3 steps" in text and f"loss {history[0]['loss']:.4f}" in text
    assert "validating" in text and "10/10 images" in text and "> epoch 1/1: loss" in text
    assert text.count("> Building the training step's graph at 16 px") == 1
    assert trainer._steps[16].experimental_get_tracing_count() == 1
    evaluate(trainer.base)  # the next epoch's evaluation runs the same graph
    assert [step.experimental_get_tracing_count() for _, step in evaluate._steps.values()] == [1]


def test_eval_prints_steps_off_a_terminal_and_nothing_with_json(tmp_path):
    from PIL import Image

    from edgevit.registry import create_model
    from edgevit.saving import save_model, set_class_names

    for name in ("ants", "bees"):
        folder = tmp_path / "data" / "val" / name
        folder.mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((20, 20, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    model = create_model("mobilevit_v3_xxs", num_classes=2, input_size=64)
    set_class_names(model, ["ants", "bees"])
    save_model(model, tmp_path / "m.keras")
    command = [sys.executable, "-m", "edgevit", "eval", str(tmp_path / "m.keras"), "--data", str(tmp_path / "data")]
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=600)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["images"] == 6 and "> Running" not in as_json.stderr
    plain = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert "> Running m.keras on the 6 images of" in plain.stderr and "6/6" not in plain.stderr  # a pipe: no bar
