"""Image-folder data, multi-scale sampler, training loop with resume, and the
bad-input messages of finetune / qat / eval."""
import keras
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgevit.cli import main
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing
from edgevit.train.data import ArrayData, find_dataset, load_split
from edgevit.train.loop import TrainConfig, Trainer, multiscale_batches, scaled_batch_size


def make_folder(root, classes=("ants", "bees"), per_class=4, splits=("train", "val"), broken=0):
    rng = np.random.default_rng(0)
    for split in splits:
        for i, name in enumerate(classes):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                img = rng.integers(0, 80, (40, 48, 3)).astype(np.uint8)
                img[..., i % 3] += 150
                Image.fromarray(img).save(folder / f"{j}.png")
            for j in range(broken):
                (folder / f"broken{j}.jpg").write_bytes(b"not a jpeg")
    return root


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_clean_error(code, stderr, match):
    assert code == 1, stderr
    assert stderr.startswith("error: ") and match in stderr, stderr
    assert "Traceback" not in stderr


def test_multiscale_sampler_scales_batch_size_and_covers_every_sample_once():
    assert scaled_batch_size(32, 256, 256) == 32
    assert scaled_batch_size(32, 256, 128) == 128
    assert scaled_batch_size(32, 256, 320) == 20
    batches = multiscale_batches(1000, 32, 256, [160, 192, 256, 320], np.random.default_rng(0))
    seen = np.concatenate([index for _, index in batches])
    assert sorted(seen.tolist()) == list(range(1000))
    assert {size for size, _ in batches} == {160, 192, 256, 320}
    for size, index in batches[:-1]:
        assert len(index) == scaled_batch_size(32, 256, size)


def test_dataset_with_train_val_folders_and_unreadable_images(tmp_path):
    make_folder(tmp_path, broken=1)
    ds = find_dataset(tmp_path)
    assert ds.classes == ["ants", "bees"] and ds.val_source == "val/"
    assert len(ds.train.files) == 10
    pre = Preprocessing(32, 36)
    train, skipped = load_split(ds.train, pre, 32)
    assert len(train) == 8 and len(skipped) == 2
    x = train.train_batch(np.arange(4), 32, np.random.default_rng(0))
    assert x.shape == (4, 32, 32, 3) and 0.0 <= x.min() and x.max() <= 1.0


def test_dataset_without_split_holds_out_a_fraction(tmp_path):
    make_folder(tmp_path, per_class=10, splits=("",))
    ds = find_dataset(tmp_path, val_split=0.2)
    assert len(ds.val.files) == 4 and len(ds.train.files) == 16
    assert not set(ds.val.files) & set(ds.train.files)


@pytest.mark.parametrize("layout, message", [
    ("missing", "does not exist"),
    ("empty", "has no images"),
    ("one_class", "one class only"),
])
def test_unusable_dataset_folders_give_one_clear_message(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout == "empty":
        (root / "train" / "ants").mkdir(parents=True)
    elif layout == "one_class":
        make_folder(root, classes=("ants",))
    with pytest.raises(EdgevitError, match=message):
        find_dataset(root)
    for command in ("finetune", "qat"):
        code, _, err = run(command, "mobilevit_v3_xxs", "--data", str(root), "-o", str(tmp_path / "m.keras"))
        assert_clean_error(code, err, message)


def test_invalid_input_size_and_foreign_keras_file_are_rejected(tmp_path):
    make_folder(tmp_path / "data")
    code, _, err = run("finetune", "mobilevit_v3_xxs", "--data", str(tmp_path / "data"),
                       "--input-size", "100", "-o", str(tmp_path / "m.keras"))
    assert_clean_error(code, err, "Input size 100 does not work")
    foreign = tmp_path / "other.keras"
    inputs = keras.Input((8, 8, 3))
    keras.Model(inputs, keras.layers.Dense(2)(inputs), name="someone_elses").save(foreign)
    for args in (["qat", str(foreign), "--data", str(tmp_path / "data"), "-o", str(tmp_path / "q.keras")],
                 ["eval", str(foreign), "--data", str(tmp_path / "data")]):
        code, _, err = run(*args)
        assert_clean_error(code, err, "not an edgevit model")
    code, _, err = run("eval", str(tmp_path / "nothing.tflite"), "--data", str(tmp_path / "data"))
    assert_clean_error(code, err, "does not exist")
    code, _, err = run("finetune", "mobilevit_v3_xxs", "--data", str(tmp_path / "data"), "-o", "m.h5")
    assert_clean_error(code, err, "must end in .keras")
    code, _, err = run("finetune", "mobilevit_v3_xxs", "--data", str(tmp_path / "data"),
                       "--multiscale", "64,abc", "-o", str(tmp_path / "m.keras"))
    assert_clean_error(code, err, "--multiscale")


def tiny_classifier(size):
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("silu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x), name="tiny")


def test_training_shares_weights_across_scales_and_resumes_after_interruption(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (24, 40, 40, 3)).astype(np.uint8)
    labels = np.arange(24) % 2
    images[labels == 1, ..., 0] = 255
    data = ArrayData(images, labels, Preprocessing(32, 36))
    cfg = TrainConfig(epochs=1, batch_size=8, lr=5e-3, sizes=[24, 32], checkpoint_dir=str(tmp_path / "ckpt"))
    base = tiny_classifier(32)
    first = Trainer(base, tiny_classifier, 32, cfg, log=lambda m: None)
    history = first.fit(data)
    assert len(history) == 1 and set(history[0]["sizes"]) <= {24, 32}
    # same weights at every scale
    np.testing.assert_array_equal(first.models[32].get_weights()[0], base.get_weights()[0])
    # "interrupted" after epoch 1: a new run with 2 epochs resumes at epoch 2
    cfg.epochs = 2
    logs = []
    resumed = Trainer(tiny_classifier(32), tiny_classifier, 32, cfg, log=logs.append)
    history = resumed.fit(data)
    assert any("Resuming" in line for line in logs)
    assert [h["epoch"] for h in history] == [1, 2]
    assert sum("epoch 2/2" in line for line in logs) == 1 and not any("epoch 1/2" in line for line in logs)
