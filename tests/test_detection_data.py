"""Detection data: COCO and VOC folders read into box arrays, what is left
out and what is refused, boxes placed with their images into batches."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevit.data.boxes import (
    BEYOND,
    CROWD,
    DIFFICULT,
    MAX_BOXES,
    MISSING,
    NO_AREA,
    OUTSIDE,
    find_detection_dataset,
    is_detection_folder,
)
from edgevit.data.targets import Boxes
from edgevit.data.transforms import transform
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing

SHAPES = ("square", "disc")


def make_detection_folder(root, per_split=8, size=(96, 80), seed=0, train_images=None):
    """A COCO-layout folder of synthetic shapes: each image a dark, noisy
    ground with one to three bright squares (category 1) and discs
    (category 2) of 18-36 px, their boxes in instances_{train,val}.json;
    ``per_split`` images in each split, or ``train_images`` in train."""
    rng = np.random.default_rng(seed)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    w, h = size
    for split, count in (("train", train_images or per_split), ("val", per_split)):
        (root / split).mkdir()
        images, annotations = [], []
        for i in range(count):
            pixels = rng.integers(0, 50, (h, w, 3)).astype(np.uint8)
            yy, xx = np.mgrid[:h, :w]
            for _ in range(rng.integers(1, 4)):
                side = int(rng.integers(18, 37))
                x0, y0 = int(rng.integers(0, w - side)), int(rng.integers(0, h - side))
                category = int(rng.integers(1, 3))
                if category == 1:
                    pixels[y0:y0 + side, x0:x0 + side] = (230, 60, 40)
                else:
                    r = side / 2
                    pixels[(yy - y0 - r + 0.5) ** 2 + (xx - x0 - r + 0.5) ** 2 <= r * r] = (40, 200, 230)
                annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": category,
                                    "bbox": [x0, y0, side, side], "area": side * side, "iscrowd": 0})
            Image.fromarray(pixels).save(root / split / f"{i:03d}.jpg", quality=95)
            images.append({"id": i + 1, "file_name": f"{i:03d}.jpg", "width": w, "height": h})
        categories = [{"id": c, "name": name, "supercategory": "shape"} for c, name in enumerate(SHAPES, 1)]
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    return root


def _coco(root, annotations, images=None, categories=None, files=("a.jpg",)):
    root.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for split in ("train", "val"):
        (root / split).mkdir(exist_ok=True)
        for name in files:
            Image.new("RGB", (40, 30)).save(root / split / name)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps({
            "images": images or [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}],
            "annotations": annotations,
            "categories": [{"id": 5, "name": "cat"}, {"id": 9, "name": "dog"}] if categories is None else categories}))
    return root


def test_coco_folder_keeps_boxes_per_image_and_counts_what_it_leaves_out(tmp_path):
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 9, "bbox": [2, 3, 10, 5]},
        {"id": 2, "image_id": 1, "category_id": 5, "bbox": [30, 20, 20, 20]},       # clipped to 40x30
        {"id": 3, "image_id": 1, "category_id": 5, "bbox": [4, 4, 0, 6]},           # no area
        {"id": 4, "image_id": 1, "category_id": 5, "bbox": [50, 4, 5, 6]},          # outside
        {"id": 5, "image_id": 1, "category_id": 5, "bbox": [1, 1, 5, 5], "iscrowd": 1},
        {"id": 6, "image_id": 2, "category_id": 5, "bbox": [1, 1, 5, 5]},           # image not in the folder
    ]
    images = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
              {"id": 2, "file_name": "gone.jpg", "width": 40, "height": 30},
              {"id": 3, "file_name": "b.jpg", "width": 40, "height": 30}]               # no boxes: kept
    root = _coco(tmp_path / "coco", annotations, images, files=("a.jpg", "b.jpg"))
    assert is_detection_folder(root)
    ds = find_detection_dataset(root)
    assert ds.classes == ["background", "cat", "dog"]
    assert [p.rsplit("/", 1)[1] for p in ds.train.files] == ["a.jpg", "b.jpg"]
    first = ds.train.boxes_of(0)
    np.testing.assert_array_equal(first.corners, [[2, 3, 12, 8], [30, 20, 40, 30]])
    np.testing.assert_array_equal(first.classes, [2, 1])
    assert len(ds.train.boxes_of(1).corners) == 0
    # both splits counted
    assert ds.skipped == {MISSING: 2, CROWD: 2, NO_AREA: 2, OUTSIDE: 2, BEYOND: 0}


def test_an_image_keeps_its_first_max_boxes(tmp_path):
    annotations = [{"id": i, "image_id": 1, "category_id": 5, "bbox": [1, 1, 3 + i % 7, 4]}
                   for i in range(MAX_BOXES + 7)]
    ds = find_detection_dataset(_coco(tmp_path / "many", annotations))
    assert len(ds.train.boxes_of(0).corners) == MAX_BOXES and ds.skipped[BEYOND] == 14
    np.testing.assert_array_equal(ds.train.boxes_of(0).corners[:2, 2], [4, 5])


@pytest.mark.parametrize("annotations, categories, message", [
    ([{"id": 1, "image_id": 1, "category_id": 7, "bbox": [1, 1, 3, 3]}], None, "category ids its categories do not"),
    ([{"id": 1, "image_id": 4, "category_id": 5, "bbox": [1, 1, 3, 3]}], None, "image ids its images do not list"),
    ([{"id": 1, "image_id": 1, "category_id": 5, "bbox": [1, 1, 3]}], None, "a bbox of 4 numbers"),
    ([], [{"id": 1, "name": "a\nb"}], "cannot name a class"),
    ([], [], "lists no categories"),
])
def test_unusable_coco_annotations_are_one_error(tmp_path, annotations, categories, message):
    root = _coco(tmp_path / "bad", annotations, categories=categories)
    with pytest.raises(EdgevitError, match=message):
        find_detection_dataset(root)


def test_not_json_and_not_coco_are_one_error(tmp_path):
    root = _coco(tmp_path / "bad", [])
    (root / "annotations" / "instances_val.json").write_text("{\"images\": [")
    with pytest.raises(EdgevitError, match="cannot be read as JSON"):
        find_detection_dataset(root)
    (root / "annotations" / "instances_val.json").write_text("[1, 2]")
    with pytest.raises(EdgevitError, match="is not a COCO annotation file"):
        find_detection_dataset(root)


def test_voc_devkit_reads_objects_and_leaves_difficult_ones_out(tmp_path):
    root = tmp_path / "VOC2007"
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True)
    for split, stem in (("train", "000005"), ("val", "000007")):
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text(stem + "\n")
        Image.new("RGB", (50, 40)).save(root / "JPEGImages" / f"{stem}.jpg")
        (root / "Annotations" / f"{stem}.xml").write_text(
            f"<annotation><filename>{stem}.jpg</filename>"
            "<object><name>dog</name><difficult>0</difficult><bndbox><xmin>11</xmin><ymin>6</ymin><xmax>30</xmax>"
            "<ymax>25</ymax></bndbox></object>"
            "<object><name>cat</name><difficult>1</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax>"
            "<ymax>9</ymax></bndbox></object></annotation>")
    ds = find_detection_dataset(root)
    assert ds.classes[12] == "dog" and len(ds.classes) == 21
    np.testing.assert_array_equal(ds.train.boxes_of(0).corners, [[10, 5, 30, 25]])
    np.testing.assert_array_equal(ds.val.boxes_of(0).classes, [12])
    assert ds.skipped[DIFFICULT] == 2
    (root / "Annotations" / "000007.xml").write_text("<annotation><object><name>unicorn</name></object></annotation>")
    with pytest.raises(EdgevitError, match="'unicorn' is not one of the classes"):
        find_detection_dataset(root)


def test_boxes_travel_with_the_whole_image_into_a_batch(tmp_path):
    ds = find_detection_dataset(make_detection_folder(tmp_path / "shapes", per_split=2))
    boxes = Boxes(ds.val)
    pre = Preprocessing(input_size=64, resize_size=64, mean=(0, 0, 0), std=(1, 1, 1), interpolation="bilinear")
    pixels, rows = transform(pre, 64)(ds.val.files[0], boxes[0])
    assert pixels.shape == (64, 64, 3) and rows.shape == (MAX_BOXES, 5)
    corners = boxes[0].corners
    n = len(corners)
    # evaluation resizes the whole image: (ymin, xmin, ymax, xmax) / (height, width)
    np.testing.assert_allclose(rows[:n, :4], corners[:, [1, 0, 3, 2]] / [80, 96, 80, 96], atol=1e-6)
    np.testing.assert_array_equal(rows[:n, 4], boxes[0].classes)
    assert not rows[n:].any()
    # a mirrored training crop moves the boxes with the pixels: the box's pixels stay bright
    draws = np.array([0.0, 0.5, 0.5, 0.1])
    pixels, rows = transform(pre, 64, is_training=True)(ds.val.files[0], boxes[0], draws)
    for ymin, xmin, ymax, xmax, _ in rows[rows[:, 4] > 0]:
        inside = pixels[int(ymin * 64) + 2:int(ymax * 64) - 2, int(xmin * 64) + 2:int(xmax * 64) - 2]
        if inside.size:
            assert inside.max(-1).mean() > 150
    subset = boxes.subset([1, 0])
    np.testing.assert_array_equal(subset[1].corners, boxes[0].corners)


MILLION_JSON = """
import json, sys
sys.path.insert(0, sys.argv[2])
from edgevit.data.boxes import find_detection_dataset


def peak_mb():  # VmHWM: this process's own peak (getrusage's carries the parent's across exec)
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


before = peak_mb()
ds = find_detection_dataset(sys.argv[1])
print(json.dumps({"boxes": int(len(ds.train.corners)), "peak_mb": peak_mb(), "before_mb": before}))
"""


def test_a_training_crop_keeps_the_boxes_whose_centre_it_keeps():
    """As cvnets' SSD crop: a box whose centre falls outside the crop is
    dropped (clipped, a sliver of a square would be taught as a square); one
    whose centre stays is clipped to the crop."""
    from edgevit.data.boxes import batch_boxes
    from edgevit.data.transforms import BoxCrop, placed_boxes

    crop = BoxCrop((20, 10, 70, 60), 50)                          # the input is the image's (20..70, 10..60)
    boxes = np.array([[10, 20, 30, 40],                           # centre x 20: on the crop's edge, out
                      [14, 20, 34, 40],                           # centre x 24: in, clipped to x 20
                      [40, 50, 60, 90]], np.float32)              # centre y 70: below the crop
    rows = batch_boxes(placed_boxes(crop, (96, 80), boxes) / 50, np.array([1, 2, 1]))
    kept = rows[rows[:, 4] > 0]
    np.testing.assert_allclose(kept, [[10 / 50, 0, 30 / 50, 14 / 50, 2]], atol=1e-6)


@pytest.mark.slow
def test_a_million_annotations_are_read_in_bounded_memory(tmp_path):
    """A COCO json of 10^6 annotations (COCO's train2017 has 0.86 M, with
    polygons) over 5 x 10^4 images, written as text: its reading's peak
    memory, in a fresh process, against the json's size."""
    rng = np.random.default_rng(0)
    root = _coco(tmp_path / "million", [])
    images = json.dumps([{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in range(50_000)])
    path = root / "annotations" / "instances_train.json"
    with open(path, "w") as out:
        out.write(f'{{"categories": [{{"id": 1, "name": "thing"}}], "images": {images}, "annotations": [')
        for i, image in enumerate(rng.integers(0, 50_000, 1_000_000)):
            out.write(f'{"," if i else ""}{{"id": {i}, "image_id": {image}, "category_id": 1, "iscrowd": 0, '
                      '"bbox": [1.5, 2.5, 30.25, 40.75], "area": 1232.4, '
                      '"segmentation": [[1.5, 2.5, 31.75, 2.5, 31.75, 43.25]]}')
        out.write("]}")
    (root / "annotations" / "instances_val.json").write_text(json.dumps(
        {"categories": [{"id": 1, "name": "thing"}], "images": json.loads(images), "annotations": []}))
    for i in range(50_000):
        (root / "train" / f"{i}.jpg").touch()
        (root / "val" / f"{i}.jpg").touch()
    json_mb = path.stat().st_size / 2**20
    out = subprocess.run([sys.executable, "-c", MILLION_JSON, str(root), str(Path.cwd())],
                         capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"json {json_mb:.0f} MB, peak RSS {measured['peak_mb']:.0f} MB ({measured['before_mb']:.0f} MB before)")
    assert measured["boxes"] == 1_000_000
    assert measured["peak_mb"] < json_mb + 400
