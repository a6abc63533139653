"""Segmentation datasets and masks (edgevit.data.masks), a mask travelling
with its image, and the per-pixel metrics (mIoU)."""
import numpy as np
import pytest
from PIL import Image

from edgevit.data.decode import UnreadableImage
from edgevit.data.masks import (MASK_COLOUR, MASK_DEPTH, MASK_INDEX, MASK_PALETTE, MASK_SIZE, VOC_CLASSES,
                                find_segmentation_dataset, is_segmentation_folder, read_mask, voc_colour_map)
from edgevit.errors import EdgevitError
from edgevit.train.metrics import SegmentationTally


def make_segmentation_folder(root, classes=("background", "square"), per_split=3, size=(48, 40)):
    """Images with a bright square on a dark ground, masks of the square (class 1) with a 255 border."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(classes) + "\n")
    for split in ("train", "val"):
        (root / split / "images").mkdir(parents=True)
        (root / split / "masks").mkdir(parents=True)
        for i in range(per_split):
            w, h = size
            x0, y0 = rng.integers(0, w // 2), rng.integers(0, h // 2)
            image = rng.integers(0, 60, (h, w, 3)).astype(np.uint8)
            image[y0:y0 + h // 2, x0:x0 + w // 2] += 150
            mask = np.zeros((h, w), np.uint8)
            mask[y0:y0 + h // 2, x0:x0 + w // 2] = 1
            mask[y0, x0:x0 + w // 2] = 255
            Image.fromarray(image).save(root / split / "images" / f"{i}.jpg")
            Image.fromarray(mask, "L").save(root / split / "masks" / f"{i}.png")
    return root


def test_both_layouts_pair_images_with_masks(tmp_path):
    folder = make_segmentation_folder(tmp_path / "shapes")
    assert is_segmentation_folder(folder)
    ds = find_segmentation_dataset(folder)
    assert ds.classes == ["background", "square"] and len(ds.train.files) == 3 and len(ds.val.masks) == 3
    assert all(m.endswith(f"{i}.png") for i, m in enumerate(ds.train.masks))
    voc = tmp_path / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    for split, stems in (("train", ["2007_000032", "2007_000039"]), ("val", ["2007_000033"])):
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(stems) + "\n")
        for stem in stems:
            Image.new("RGB", (20, 10)).save(voc / "JPEGImages" / f"{stem}.jpg")
            Image.new("P", (20, 10)).save(voc / "SegmentationClass" / f"{stem}.png")
    ds = find_segmentation_dataset(voc)
    assert ds.classes == list(VOC_CLASSES) and len(ds.train.files) == 2 and ds.val.files[0].endswith("33.jpg")


@pytest.mark.parametrize("change, message", [
    (lambda root: (root / "train" / "masks" / "1.png").unlink(), "have no mask"),
    (lambda root: (root / "classes.txt").write_text("background\nsquare\nbackground\n"), "names 'background' twice"),
    (lambda root: (root / "classes.txt").write_text("background\n"), "at least two"),
    (lambda root: (root / "classes.txt").unlink(), "has no classes.txt"),
])
def test_unusable_segmentation_folders_are_one_error_naming_the_file(tmp_path, change, message):
    folder = make_segmentation_folder(tmp_path / "shapes")
    change(folder)
    with pytest.raises(EdgevitError, match=message):
        find_segmentation_dataset(folder)


def test_masks_that_cannot_serve_are_refused_with_their_reason(tmp_path):
    indices = np.zeros((10, 20), np.uint8)
    indices[2:5, 3:9] = 1
    indices[0] = 255
    cases = {
        "gray.png": (Image.fromarray(indices, "L"), None),
        "voc.png": (Image.fromarray(indices, "P"), voc_colour_map()),
        "wrong_size.png": (Image.fromarray(indices[:, :15], "L"), MASK_SIZE),
        "index.png": (Image.fromarray(indices * 3, "L"), MASK_INDEX),
        "deep.png": (Image.fromarray(indices.astype(np.uint16) * 300), MASK_DEPTH),
        "colour.png": (Image.fromarray(np.stack([indices * 100] * 3, -1)), MASK_COLOUR),
        "lying.png": (Image.fromarray(indices, "P"), np.roll(voc_colour_map(), 5, axis=0)),
    }
    for name, (mask, expected) in cases.items():
        if name in ("voc.png", "lying.png"):
            mask.putpalette(expected.ravel().tolist())
            expected = None if name == "voc.png" else MASK_PALETTE
        mask.save(tmp_path / name)
        if expected is None:
            np.testing.assert_array_equal(np.asarray(read_mask(tmp_path / name, (20, 10), 2)), indices)
        else:
            with pytest.raises(UnreadableImage) as caught:
                read_mask(tmp_path / name, (20, 10), 2)
            assert caught.value.reason == expected, name


def test_miou_counts_pixels_a_batch_at_a_time_and_ignores_255():
    tally = SegmentationTally(["background", "a", "b"])
    masks = np.array([[[0, 0, 1, 1], [0, 255, 1, 2]]])
    predicted = np.array([[[0, 1, 1, 1], [0, 2, 1, 2]]])
    tally.add(predicted[:, :1], masks[:, :1])
    tally.add(predicted[:, 1:], masks[:, 1:])
    report = tally.report()
    assert report["pixels"] == 7 and report["pixel_accuracy"] == round(6 / 7, 4)
    # background: 2 hits of 3 (true 2, predicted 2, union 3); a: 3 of 4; b: 1 of 1
    assert report["per_class_iou"] == {"background": round(2 / 3, 4), "a": 0.75, "b": 1.0}
    assert report["miou"] == round((2 / 3 + 0.75 + 1.0) / 3, 4)


def test_a_mask_file_is_read_and_placed_with_its_image(tmp_path):
    """Training and evaluation transforms place the mask where they place
    its image: the bright square's pixels are the mask's class-1 pixels."""
    from edgevit.data.masks import MaskFile
    from edgevit.data.transforms import transform
    from edgevit.registry import Preprocessing

    folder = make_segmentation_folder(tmp_path / "shapes", size=(96, 80))
    ds = find_segmentation_dataset(folder)
    pre = Preprocessing(32, 36, "bilinear")
    for place, draws in ((transform(pre, 32), None), (transform(pre, 32, is_training=True), [0.9, 0.2, 0.7, 0.1]),
                         (transform(pre, 32, is_training=True), [0.5, 0.5, 0.5, 0.9])):
        for image, mask in zip(ds.train.files, ds.train.masks):
            pixels, placed = place(image, MaskFile(mask, 2), draws)
            assert placed.shape == (32, 32) and set(np.unique(placed)) <= {0, 1, 255}
            bright = pixels.mean(-1) > 140
            inside = placed == 1
            if inside.sum() > 20:  # away from the square's edges the two agree
                assert bright[inside].mean() > 0.8 and (~bright[placed == 0]).mean() > 0.9
    Image.new("L", (5, 5)).save(tmp_path / "small.png")
    with pytest.raises(UnreadableImage, match="differs from its image"):
        transform(pre, 32)(ds.train.files[0], MaskFile(str(tmp_path / "small.png"), 2))


def test_the_stream_carries_masks_in_the_one_batch_shape(tmp_path):
    """Training and evaluation batches of a segmentation folder: uint8
    pixels, uint8 masks of the input's size, and which places are real; a
    mask that cannot serve leaves its image out, counted by its reason."""
    from edgevit.data.stream import ImageStream, plan_epoch
    from edgevit.registry import Preprocessing

    folder = make_segmentation_folder(tmp_path / "shapes", per_split=4, size=(64, 48))
    Image.new("L", (10, 10)).save(folder / "train" / "masks" / "3.png")  # does not fit its image
    ds = find_segmentation_dataset(folder)
    stream = ImageStream(ds.train, Preprocessing(32, 32))
    plan = plan_epoch(len(stream), 4, 1, 32, [], np.random.default_rng(0))
    (pixels, masks, real), = list(stream.training_dataset(plan, 0))
    assert pixels.shape == (4, 32, 32, 3) and masks.shape == (4, 32, 32) and masks.dtype == "uint8"
    assert real.numpy().all()  # the unfit mask's place went to another image
    assert set(np.unique(masks.numpy())) <= {0, 1, 255}
    assert stream.tally.counts() == {MASK_SIZE: 1}
    batches = list(stream.evaluation_dataset(32, batch_size=4))
    assert [b[2].numpy().tolist() for b in batches] == [[True, True, True, False]]
    inputs, targets = next(stream.batches(32))
    assert inputs.shape == (3, 32, 32, 3) and inputs.dtype == np.float32 and targets.shape == (3, 32, 32)


def test_the_segmentation_objective_counts_only_the_pixels_a_mask_counts():
    """Per-pixel cross-entropy over counted pixels, logits resized from the
    output stride to the mask; validation's confusion gives the same mIoU
    as SegmentationTally."""
    import tensorflow as tf

    from edgevit.train.objectives import Segmentation

    objective = Segmentation(3)
    logits = tf.constant(np.random.default_rng(0).normal(size=(2, 4, 4, 3)), tf.float32)
    masks = np.random.default_rng(1).integers(0, 3, (2, 8, 8)).astype(np.uint8)
    masks[0, :2] = 255
    masks_t = tf.constant(masks)
    assert float(objective.units(masks_t)) == 2 * 64 - 16
    resized = tf.image.resize(logits, (8, 8)).numpy()
    log_probs = resized - np.log(np.exp(resized).sum(-1, keepdims=True))
    counted = masks != 255
    expected = -log_probs.reshape(-1, 3)[np.arange(128), np.where(counted, masks, 0).ravel()][counted.ravel()].sum()
    assert float(objective.loss_sum(logits, masks_t)) == pytest.approx(expected, rel=1e-5)
    predicted = resized.argmax(-1)
    assert float(objective.hits(logits, masks_t)) == ((predicted == masks) & counted).sum()
    real = tf.constant([True, False])
    metrics = objective.metrics(objective.counts(logits, masks_t, real).numpy())
    tally = SegmentationTally(["a", "b", "c"])
    tally.add(predicted[:1], masks[:1])
    assert metrics["val_miou"] == tally.report()["miou"]
    assert metrics["val_pixel_accuracy"] == tally.report()["pixel_accuracy"]
