"""Image-folder data, the streaming input pipeline, multi-scale sampler,
training loop with resume, and the bad-input messages of finetune / qat / eval."""
import json
import os

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgevit.cli import main
from edgevit.data.decode import NOT_AN_IMAGE, NOT_OPENED, open_rgb
from edgevit.data.folders import Split, find_dataset
from edgevit.data.listing import image_paths
from edgevit.data.stream import ImageStream, plan_epoch, scaled_batch_size
from edgevit.data.transforms import center_crop, crop_draws, normalise
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing
from edgevit.train.loop import TrainConfig, Trainer


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


def test_epoch_plans_cover_every_image_once_or_take_a_fixed_number_of_steps():
    assert scaled_batch_size(32, 256, 256) == 32
    assert scaled_batch_size(32, 256, 128) == 128
    assert scaled_batch_size(32, 256, 320) == 20
    plan = plan_epoch(1000, 32, 1, 256, [160, 192, 256, 320], np.random.default_rng(0))
    offsets, counts, sizes = map(list, zip(*plan))
    assert sum(counts) == 1000 and set(sizes) == set(plan.sizes) == {160, 192, 256, 320}
    assert offsets == [sum(counts[:t]) for t in range(len(plan))] and list(plan.sizes) == sizes
    for size, count in zip(sizes[:-1], counts[:-1]):
        assert count == scaled_batch_size(32, 256, size)
    # two replicas share the global batch; a last batch of fewer images than replicas is left out
    plan = plan_epoch(70, 32, 2, 64, [], np.random.default_rng(0))
    assert list(plan) == [(0, 32, 64), (32, 32, 64), (64, 6, 64)]
    assert [count for _, count, _ in plan_epoch(65, 32, 2, 64, [], np.random.default_rng(0))] == [32, 32]
    fixed = plan_epoch(70, 32, 2, 64, [], np.random.default_rng(0), steps=5)
    assert [count for _, count, _ in fixed] == [32] * 5  # 160 images: the order wraps into another pass


def test_an_epoch_plan_of_a_billion_steps_costs_no_memory_and_its_dataset_starts_at_once(tmp_path):
    """--steps-per-epoch 1000000000 on 8 images built Python lists of every
    step first: 4.9 GB in 2 minutes, no output, SIGTERM not honoured."""
    import resource
    import time

    make_folder(tmp_path, per_class=4, splits=("train",))
    train = ImageStream(find_dataset(tmp_path, val_split=0.25).train, Preprocessing(32, 36))
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    plan = plan_epoch(len(train), 4, 1, 32, [32, 48], np.random.default_rng(0), steps=10**9)
    batches = iter(train.training_dataset(plan, 0))
    first = [next(batches) for _ in range(3)]
    assert time.monotonic() - start < 20 and len(plan) == 10**9
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB
    assert [int(x.shape[1]) for x, _, _ in first] == [size for size, _ in zip(plan.sizes, range(3))]
    # far into the plan, a step is found alone
    assert plan.size_and_count(987_654_321)[0] in (32, 48)


def test_the_pipeline_reads_every_image_of_an_epoch_once_and_counts_the_unreadable_ones(tmp_path):
    make_folder(tmp_path, per_class=10, broken=1)
    ds = find_dataset(tmp_path)
    pre = Preprocessing(32, 36)
    train = ImageStream(ds.train, pre)
    plan = plan_epoch(len(train), 8, 1, 32, [], np.random.default_rng(0))
    labels = np.concatenate([y.numpy()[real.numpy()] for _, y, real in train.training_dataset(plan, 7)])
    assert len(labels) == 22  # an unreadable image's place goes to another image
    assert len(train.tally) == 2 and train.tally.counts() == {NOT_AN_IMAGE: 2}
    # the next epoch meets them again: still two
    list(train.training_dataset(plan, 8))
    assert len(train.tally) == 2
    # two input pipelines of one replica each read disjoint halves of every step
    plan = plan_epoch(len(train), 8, 2, 32, [], np.random.default_rng(0))
    shards = [[len(y) for _, y, _ in train.training_dataset(plan, 7, pipeline=p)] for p in range(2)]
    assert shards == [[4, 4, 3], [4, 4, 3]]


def test_pipeline_pixels_are_the_reference_transforms_on_the_same_crop_box(tmp_path):
    """Training: a random crop of the image's centre square (area, position
    and mirror from the epoch's counter-based draws) resized once from the
    decoded image with Pillow's bilinear filter. Evaluation: the shorter side
    resized and the centre square cropped straight from the file, the
    transform the exported files describe. Both leave uint8 pixels, which
    numpy and TensorFlow normalise by the same formula to the same values."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "data" / "train"
    for name, shape in (("a", (61, 97, 3)), ("b", (120, 45, 3))):
        (folder / name).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, shape).astype(np.uint8)).save(folder / name / "x.png")
    pre = Preprocessing(32, 37, "bicubic", mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    path = str(folder / "a" / "x.png")
    stream = ImageStream(Split([path], np.zeros(1, np.int64)), pre)
    img = open_rgb(path)
    w, h = img.size
    side = min(w, h)
    plan = plan_epoch(1, 1, 1, 40, [], np.random.default_rng(0))
    for epoch_seed in range(6):
        (x, _, real), = list(stream.training_dataset(plan, epoch_seed))
        u, a, b, mirror = crop_draws(epoch_seed, 0).numpy()
        crop = int(side * np.sqrt(0.35 + 0.65 * u))
        x0, y0 = (w - side) // 2 + int(a * (side - crop + 1)), (h - side) // 2 + int(b * (side - crop + 1))
        expected = np.asarray(img.resize((40, 40), Image.Resampling.BILINEAR, box=(x0, y0, x0 + crop, y0 + crop)))
        expected = expected[:, ::-1] if mirror < 0.5 else expected
        assert real.numpy().tolist() == [True]
        np.testing.assert_array_equal(x.numpy()[0], expected)  # uint8: the training step normalises
        np.testing.assert_array_equal(normalise(x, pre).numpy()[0], normalise(expected, pre))
    resize = round(40 * 37 / 32)
    evaluated = np.asarray(center_crop(open_rgb(path), resize, 40, "bicubic"))
    (x, _, real), = list(stream.evaluation_dataset(40))
    np.testing.assert_array_equal(x.numpy()[0], evaluated)
    (inputs, _), = list(stream.batches(40))
    np.testing.assert_array_equal(inputs[0], normalise(evaluated, pre))


def test_a_jpeg_training_crop_is_the_same_box_through_tensorflows_decoder(tmp_path):
    """A whole, upright JPEG is decoded and cropped by TensorFlow: the same
    box and mirror as Pillow's path, resampled a little differently; an
    EXIF-rotated or truncated JPEG and a PNG take Pillow's path."""
    from edgevit.data.transforms import tensorflow_box, transform

    y, x = np.mgrid[0:90, 0:120]
    smooth = np.stack([x * 2, y * 2, (x + y)], -1).astype(np.uint8)
    Image.fromarray(smooth).save(tmp_path / "x.jpg", quality=95)
    rotated = Image.fromarray(smooth)
    exif = rotated.getexif()
    exif[0x0112] = 6
    rotated.save(tmp_path / "rotated.jpg", exif=exif)
    (tmp_path / "truncated.jpg").write_bytes((tmp_path / "x.jpg").read_bytes()[:-50])
    Image.fromarray(smooth).save(tmp_path / "x.png")
    place = transform(Preprocessing(64, 64), 64, is_training=True)  # a crop of 64 px needs every pixel
    draws = [0.3, 0.8, 0.1, 0.2]
    for other in ("rotated.jpg", "truncated.jpg", "x.png"):
        assert tensorflow_box(str(tmp_path / other), place, draws) is None, other
    assert tensorflow_box(str(tmp_path / "x.jpg"), place, draws) is not None
    stream = ImageStream(Split([str(tmp_path / "x.jpg"), str(tmp_path / "x.png")], np.array([0, 1])),
                         Preprocessing(64, 64))
    plan = plan_epoch(2, 2, 1, 64, [], np.random.default_rng(0))
    (pixels, labels, real), = list(stream.training_dataset(plan, 3))
    order = [stream.files.index(str(tmp_path / name)) for name in ("x.jpg", "x.png")]
    assert real.numpy().all() and sorted(labels.numpy().tolist()) == [0, 1]
    for position in range(2):
        draws = crop_draws(3, position).numpy()
        index = int(labels.numpy()[position])
        expected, _ = place(stream.files[index], 0, draws)
        difference = np.abs(pixels.numpy()[position].astype(int) - expected)
        if index == order[1]:  # the PNG: Pillow's path, exactly
            assert difference.max() == 0
        else:
            assert 0 < difference.max() <= 12 and difference.mean() < 2.0, (difference.mean(), difference.max())


def test_a_mask_and_boxes_are_placed_with_their_image(tmp_path):
    """The transforms take an image and its target: a mask is cropped,
    resized (nearest) and mirrored with its image, boxes are moved and
    clipped with it, a label is left as it is."""
    from edgevit.data.transforms import placed_boxes, transform

    img = Image.fromarray(np.tile(np.arange(80, dtype=np.uint8)[None, :, None], (60, 1, 3)))  # x in every pixel
    mask = Image.fromarray(np.tile(np.arange(80, dtype=np.uint8)[None, :], (60, 1)))
    pre = Preprocessing(30, 30, "bilinear")
    training = transform(pre, 30, is_training=True)
    for draws in ([0.2, 0.1, 0.9, 0.3], [0.9, 0.7, 0.2, 0.8]):
        placement = training.placement(img.size, draws)
        pixels = np.asarray(placement.apply(img, Image.Resampling.BILINEAR))[..., 0].astype(int)
        placed = np.asarray(placement.apply(mask, Image.Resampling.NEAREST)).astype(int)
        assert np.abs(pixels - placed).max() <= 1  # the same geometry, each with its filter
        assert (np.diff(placed[0]) <= 0).all() == placement.mirror  # mirrored rows run right to left
        left, top, right, bottom = placement.box
        (x0, y0, x1, y1), = placed_boxes(placement, img.size, np.array([[left, top, right, bottom]]))
        assert (x0, y0, x1, y1) == (0, 0, 30, 30)  # the crop box itself fills the input
        assert not placed_boxes(placement, img.size, np.array([[0, 0, left, 60]])).any()  # left of the crop: empty
    img.save(tmp_path / "x.png")
    pixels, placed = training(tmp_path / "x.png", mask, [0.5, 0.5, 0.5, 0.9])
    assert pixels.shape == (30, 30, 3) and placed.shape == (30, 30) and placed.dtype == np.uint8
    assert np.abs(pixels[..., 0].astype(int) - placed).max() <= 1
    pixels, label = transform(pre, 30)(tmp_path / "x.png", np.int64(3))
    assert label == 3 and pixels.shape == (30, 30, 3)


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


def image_stream(root, per_class=12, size=32):
    make_folder(root, per_class=per_class, splits=("train",))
    pre = Preprocessing(size, 36)
    return ImageStream(find_dataset(root, val_split=0.1).train, pre)


def test_training_shares_weights_across_scales_and_resumes_after_interruption(tmp_path):
    data = image_stream(tmp_path / "data")
    cfg = TrainConfig(epochs=1, batch_size=8, lr=5e-3, sizes=[24, 32], checkpoint_dir=str(tmp_path / "ckpt"))
    base = tiny_classifier(32)
    first = Trainer(base, tiny_classifier, 32, cfg, log=lambda m: None)
    history = first.fit(data)
    assert len(history) == 1 and set(history[0]["sizes"]) <= {24, 32} and history[0]["images"] == len(data)
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


def test_epochs_of_fixed_steps_resume_and_a_class_folder_emptied_meanwhile_is_counted(tmp_path):
    data = image_stream(tmp_path / "data")
    cfg = TrainConfig(epochs=1, batch_size=4, lr=5e-3, steps_per_epoch=3, checkpoint_dir=str(tmp_path / "ckpt"))
    history = Trainer(tiny_classifier(32), None, 32, cfg, log=lambda m: None).fit(data)
    assert [h["images"] for h in history] == [12]
    for path in (tmp_path / "data" / "train" / "bees").iterdir():  # removed while the run was stopped
        path.unlink()
    cfg.epochs = 3
    history = Trainer(tiny_classifier(32), None, 32, cfg, log=lambda m: None).fit(data)
    assert [h["epoch"] for h in history] == [1, 2, 3] and [h["images"] for h in history] == [12, 12, 12]
    assert len(data.tally) > 0 and set(data.tally.counts()) == {NOT_OPENED}


def test_an_epoch_of_unreadable_images_is_one_error(tmp_path):
    make_folder(tmp_path, per_class=0, broken=3, splits=("",))
    stream = ImageStream(find_dataset(tmp_path, val_split=0.2).train, Preprocessing(16, 16))
    with pytest.raises(EdgevitError, match=rf"^None of the images of epoch 1 could be read: 5 unreadable image\(s\) "
                                           rf"skipped: 5 {NOT_AN_IMAGE} \(broken"):
        Trainer(tiny_classifier(16), None, 16, TrainConfig(epochs=1, batch_size=2), log=lambda m: None).fit(stream)


def test_listing_neither_follows_a_folder_link_back_up_nor_drops_a_file_link_loop(tmp_path):
    make_folder(tmp_path, per_class=2, splits=("",))
    os.symlink("..", tmp_path / "ants" / "up")          # a folder loop
    os.symlink("loop.jpg", tmp_path / "bees" / "loop.jpg")  # a file that links to itself
    files = image_paths(str(tmp_path))
    assert len(files) == 5 and str(tmp_path / "bees" / "loop.jpg") in files
    stream = ImageStream(Split(files, np.zeros(5, np.int64)), Preprocessing(16, 16))
    assert sum(int(real.numpy().sum()) for _, _, real in stream.evaluation_dataset(16)) == 4
    assert stream.tally.counts() == {NOT_OPENED: 1}


def test_finetune_streams_with_steps_per_epoch_and_reports_the_unreadable_images(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_folder(tmp_path / "data", per_class=6, broken=1)
    code, out, err = run("finetune", "mobilevit_v3_xxs", "--input-size", "32", "--data", "data", "--epochs", "2",
                         "--steps-per-epoch", "2", "--batch-size", "4", "--json", "-o", "m.keras")
    assert code == 0, err
    result = json.loads(out)
    assert [h["images"] for h in result["history"]] == [8, 8]
    assert result["steps_per_epoch"] == 2 and result["replicas"] == 1 and result["workers"] == 1
    assert result["unreadable_skipped"] >= 2 and set(result["skipped_reasons"]) == {NOT_AN_IMAGE}
    assert result["seconds_to_first_step"] > 0 and (tmp_path / "m.keras").exists()
    assert result["kept_epoch"] == 2 and result["best_val_epoch"] in (1, 2) and "epoch 2" in result["kept"]


def test_the_saved_epoch_is_named_and_a_better_earlier_one_is_explained():
    from edgevit.train.run import kept_epoch as _kept_epoch

    history = [{"epoch": 1, "val_top1": 0.673}, {"epoch": 2, "val_top1": 0.65}, {"epoch": 3, "val_top1": 0.634}]
    kept = _kept_epoch(history)
    assert kept["kept_epoch"] == 3 and kept["best_val_epoch"] == 1
    assert kept["kept"].startswith("the last epoch's weights (epoch 3, val top-1 0.634); epoch 1 scored higher "
                                   "(0.673), but the run ends where its learning-rate schedule does")
    assert kept["kept"].endswith("(to stop earlier, train with --epochs 1)")
    assert _kept_epoch(history[:1])["kept"] == "the last epoch's weights (epoch 1, val top-1 0.673)"
    assert _kept_epoch([]) == {}


def test_mixed_precision_trains_a_float16_copy_and_the_saved_model_computes_in_float32(tmp_path):
    from edgevit.train.precision import mixed_precision_copy

    data = image_stream(tmp_path / "data")
    model = tiny_classifier(32)
    mixed = mixed_precision_copy(model)
    assert {layer.dtype_policy.name for layer in mixed.layers[1:]} == {"mixed_float16"}
    assert keras.config.dtype_policy().name == "float32"  # the global policy is left as it was
    before = [w.copy() for w in model.get_weights()]
    cfg = TrainConfig(epochs=1, batch_size=8, lr=5e-3, steps_per_epoch=2, mixed_precision=True)
    trainer = Trainer(mixed, None, 32, cfg, log=lambda m: None)
    assert np.isfinite(trainer.fit(data)[0]["loss"])
    assert type(trainer.optimizer).__name__ == "LossScaleOptimizer"
    model.set_weights(mixed.get_weights())
    assert all(w.dtype == np.float32 for w in model.get_weights())
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert {layer.dtype_policy.name for layer in model.layers[1:]} == {"float32"}
    assert model(np.zeros((1, 32, 32, 3), np.float32)).dtype == "float32"


def test_files_without_an_image_suffix_in_class_folders_are_named_not_dropped_silently(tmp_path):
    from edgevit.data.folders import find_evaluation_images
    from edgevit.data.listing import left_out_summary
    from edgevit.registry import get_spec
    from edgevit.train.prepare import load_data

    make_folder(tmp_path, per_class=2)
    (tmp_path / "train" / "ants" / "README").write_bytes(b"")    # an empty file without a suffix
    (tmp_path / "val" / "bees" / "labels.csv").write_text("x")
    (tmp_path / "train" / "ants" / ".DS_Store").write_bytes(b"")  # hidden: left out without a word
    dataset = find_dataset(tmp_path)
    assert dataset.left_out == ["train/ants/README", "val/bees/labels.csv"]
    assert len(dataset.train.files) == 4 and len(dataset.val.files) == 4
    lines = []
    load_data(dataset, get_spec("mobilevit_v3_xxs"), 32, [], lines.append)
    assert lines[1] == left_out_summary(dataset.left_out)
    assert lines[1].startswith("2 file(s) without an image suffix (") and lines[1].endswith(
        "left out: train/ants/README, val/bees/labels.csv")
    assert find_evaluation_images(tmp_path).left_out == ["val/bees/labels.csv"]


def test_the_jpeg_header_reader_agrees_with_pillow(tmp_path):
    """Size, colour components and EXIF orientation, read from the markers
    alone, as Pillow reads them; anything else is None (Pillow's path)."""
    from edgevit.data.jpeg_header import read_jpeg_header

    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 50, 3)).astype(np.uint8))
    cases = {"baseline.jpg": (rgb, {}), "progressive.jpg": (rgb, {"progressive": True}),
             "gray.jpg": (rgb.convert("L"), {}), "cmyk.jpg": (rgb.convert("CMYK"), {})}
    for orientation in (3, 6, 8):
        exif = rgb.getexif()
        exif[0x0112] = orientation
        cases[f"rotated{orientation}.jpg"] = (rgb, {"exif": exif})
    for name, (image, options) in cases.items():
        image.save(tmp_path / name, **options)
        header = read_jpeg_header(str(tmp_path / name))
        with Image.open(tmp_path / name) as opened:
            assert (header.width, header.height) == opened.size, name
            assert header.components == len(opened.getbands()), name
            assert header.orientation == opened.getexif().get(0x0112, 1), name
            assert header.whole, name
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "baseline.jpg").read_bytes()[:-10])
    assert not read_jpeg_header(str(tmp_path / "cut.jpg")).whole
    rgb.save(tmp_path / "x.png")
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00")
    for name in ("x.png", "empty.jpg", "junk.jpg", "missing.jpg"):
        assert read_jpeg_header(str(tmp_path / name)) is None, name
