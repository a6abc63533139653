"""Detection datasets: images with their boxes, in either layout users have:

- COCO: ``DIR/train/`` and ``DIR/val/`` images with
  ``DIR/annotations/instances_train.json`` and ``instances_val.json``
  (COCO's format; the class names are the json's categories, in the order
  of their ids, after the background);
- a Pascal VOC devkit folder as it is: ``JPEGImages/``, ``Annotations/``
  (one XML a image) and ``ImageSets/Main/{train,val}.txt`` (VOC's 20 class
  names after the background, or ``classes.txt`` beside them).

Class 0 is the background, as the SSD heads count it. A split holds its
boxes as three numpy arrays (every box's corners, every box's class, where
each image's boxes start), not as Python objects: reading a COCO json of
10^6 annotations keeps each annotation's numbers as it is parsed and drops
the rest (:func:`_read_coco_json`). What cannot be used is refused with one
error (an unknown category, an annotation of an image the json does not
list, a json that is not COCO's) or left out and counted (:attr:`DetectionFolder.skipped`):
a crowd region, a box of no area or wholly outside its image, VOC's
"difficult" objects, boxes beyond MAX_BOXES in one image, an image the json
lists that is not in the folder. A box partly outside its image is clipped
to it. An image without boxes stays: it teaches the background.
"""
from __future__ import annotations

import hashlib
import json
import os
import xml.etree.ElementTree as ElementTree
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgevit.data.labels import label_problem
from edgevit.data.masks import VOC_CLASSES, read_classes
from edgevit.errors import EdgevitError

# Boxes one image keeps (COCO's most is 93; its mAP scores 100 detections an image): the first ones, in the order
# the annotations list them, beyond it left out and counted.
MAX_BOXES = 100
BACKGROUND = "background"

# Why a box or an image is left out (counted by these).
CROWD = "crowd regions (iscrowd 1)"
NO_AREA = "boxes of no area"
OUTSIDE = "boxes wholly outside their image"
DIFFICULT = "VOC objects marked difficult"
BEYOND = f"boxes beyond the first {MAX_BOXES} of an image"
MISSING = "images the annotations list that are not in the folder"


@dataclass(frozen=True)
class ImageBoxes:
    """The boxes of one image: ``corners`` [n, 4] float32 (x0, y0, x1, y1 in
    its upright pixels) and their ``classes`` [n] (>= 1)."""
    corners: np.ndarray
    classes: np.ndarray


@dataclass
class BoxSplit:
    """The images of a split and their boxes: image ``i``'s are rows
    ``starts[i]:starts[i + 1]`` of ``corners`` and ``box_classes``."""
    files: list[str]
    corners: np.ndarray       # [K, 4] float32
    box_classes: np.ndarray   # [K] int32
    starts: np.ndarray        # [len(files) + 1] int64
    classes: int              # with the background

    def boxes_of(self, index: int) -> ImageBoxes:
        rows = slice(int(self.starts[index]), int(self.starts[index + 1]))
        return ImageBoxes(self.corners[rows], self.box_classes[rows])


@dataclass
class DetectionFolder:
    root: str
    classes: list[str]        # "background" first
    train: BoxSplit
    val: BoxSplit
    layout: str
    skipped: dict[str, int] = field(default_factory=dict)   # what was left out, by reason
    left_out: list[str] = field(default_factory=list)       # (names its images: none left out by suffix)

    @property
    def val_source(self) -> str:
        return f"val of a {self.layout} folder"

    def fingerprint(self) -> str:
        """A hash of the classes, every image's path (relative to the root) and every box."""
        digest = hashlib.sha256(json.dumps(self.classes).encode())
        for split in (self.train, self.val):
            for path in split.files:
                digest.update(os.fsencode(os.path.relpath(path, self.root)) + b"\n")
            for array_ in (split.corners, split.box_classes, split.starts):
                digest.update(np.ascontiguousarray(array_).tobytes())
        return digest.hexdigest()[:16]


def _coco_json(root: Path, split: str) -> Path:
    return root / "annotations" / f"instances_{split}.json"


def is_detection_folder(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds detection annotations (either layout)."""
    root = Path(root)
    return _coco_json(root, "train").is_file() or (root / "Annotations").is_dir()


def find_detection_dataset(root: str | os.PathLike) -> DetectionFolder:
    """The classes, images and boxes of ``root``; one clear error for each unusable layout."""
    root = Path(root)
    if not root.is_dir():
        raise EdgevitError(f"Dataset folder {str(root)!r} does not exist or is not a folder.")
    skipped: Counter = Counter()
    if (root / "Annotations").is_dir():
        classes_file = root / "classes.txt"
        classes = read_classes(classes_file) if classes_file.exists() else list(VOC_CLASSES)
        splits = [_voc_split(root, name, classes, skipped) for name in ("train", "val")]
        layout = "VOC devkit (Annotations, ImageSets/Main)"
    else:
        if not _coco_json(root, "train").is_file():
            raise EdgevitError(f"Dataset folder {str(root)!r} is no detection folder: COCO's layout has "
                               f"{_coco_json(root, 'train')} (and the same for val), VOC's an Annotations/ folder.")
        classes, train = _coco_split(root, "train", None, skipped)
        _, val = _coco_split(root, "val", classes, skipped)
        splits, layout = [train, val], "COCO (annotations/instances_*.json)"
    return DetectionFolder(str(root), classes, *splits, layout, dict(skipped))


def batch_boxes(corners: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """[MAX_BOXES, 5] float32, a row a box as a batch holds it: (ymin, xmin,
    ymax, xmax) normalised to [0, 1], then its class; rows of class 0 after
    the boxes. ``corners`` [n, 4]: (x0, y0, x1, y1) normalised, clipped; a
    box the crop has left empty, or thinner than a thousandth of the input,
    is left out."""
    corners = np.asarray(corners, np.float32).reshape(-1, 4)
    kept = (corners[:, 2] - corners[:, 0] > 1e-3) & (corners[:, 3] - corners[:, 1] > 1e-3)
    rows = np.zeros((MAX_BOXES, 5), np.float32)
    count = min(int(kept.sum()), MAX_BOXES)
    rows[:count, :4] = corners[kept][:count][:, [1, 0, 3, 2]]
    rows[:count, 4] = np.asarray(classes)[kept][:count]
    return rows


# -- COCO --------------------------------------------------------------------------------------------
def _read_coco_json(path: Path):
    """(the json with each annotation replaced by None, annotation arrays):
    every annotation's image id, category id, iscrowd and bbox kept in flat
    arrays as the parser meets it, so that 10^6 annotations are not 10^6
    dictionaries at once."""
    images, categories, crowd, bbox = array("q"), array("q"), array("b"), array("d")

    def kept(obj: dict):
        if "bbox" not in obj or "image_id" not in obj:
            return obj
        box = obj["bbox"]
        if (not isinstance(box, list) or len(box) != 4 or not all(isinstance(v, (int, float)) for v in box)
                or not isinstance(obj["image_id"], int) or not isinstance(obj.get("category_id"), int)):
            raise EdgevitError(f"{path}: annotation {obj.get('id', '?')} is not COCO's (a bbox of 4 numbers "
                               "[x, y, width, height], an integer image_id and category_id).")
        images.append(obj["image_id"])
        categories.append(obj["category_id"])
        crowd.append(1 if obj.get("iscrowd") else 0)
        bbox.extend(box)
        return None

    try:
        # read as text: bytes read and then decoded were both held while parsing (a third more at the peak)
        with open(path, encoding="utf-8") as file:
            top = json.load(file, object_hook=kept)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EdgevitError(f"{path} cannot be read as JSON ({err.__class__.__name__}: {err}).") from None
    if not isinstance(top, dict) or not all(isinstance(top.get(key), list)
                                            for key in ("images", "annotations", "categories")):
        raise EdgevitError(f"{path} is not a COCO annotation file: it needs the lists images, annotations and "
                           "categories.")
    if any(annotation is not None for annotation in top["annotations"]):
        raise EdgevitError(f"{path}: some annotations have no bbox or image_id.")
    return top, (np.frombuffer(images, np.int64), np.frombuffer(categories, np.int64),
                 np.frombuffer(crowd, np.int8).astype(bool), np.frombuffer(bbox, np.float64).reshape(-1, 4))


def _coco_categories(path: Path, categories: list) -> tuple[list[str], dict[int, int]]:
    """(class names, background first; COCO category id -> class index)."""
    try:
        ordered = sorted((int(c["id"]), str(c["name"])) for c in categories)
    except (TypeError, KeyError, ValueError):
        raise EdgevitError(f"{path}: each category needs an integer id and a name.") from None
    if not ordered:
        raise EdgevitError(f"{path} lists no categories.")
    names = [BACKGROUND]
    for category_id, name in ordered:
        problem = label_problem(name)
        if problem or name in names:
            raise EdgevitError(f"{path}: category {category_id} {name!r} cannot name a class: "
                               f"{problem or 'the name is taken'}.")
        names.append(name)
    return names, {category_id: index for index, (category_id, _) in enumerate(ordered, 1)}


def _coco_split(root: Path, split: str, classes: list[str] | None, skipped: Counter) -> tuple[list[str], BoxSplit]:
    path, folder = _coco_json(root, split), root / split
    if not path.is_file():
        raise EdgevitError(f"{path} is missing: a COCO-layout folder has the annotations of its {split} images there.")
    if not folder.is_dir():
        raise EdgevitError(f"{folder} is missing: the images of {path.name} go there.")
    top, (image_ids, category_ids, crowd, bbox) = _read_coco_json(path)
    names, index_of = _coco_categories(path, top["categories"])
    if classes is not None and names != classes:
        raise EdgevitError(f"{path} lists other categories than {_coco_json(root, 'train')}: both splits need the "
                           "same.")
    try:
        listed = [(int(image["id"]), str(image["file_name"]), float(image.get("width") or 0),
                  float(image.get("height") or 0)) for image in top["images"]]
    except (TypeError, KeyError, ValueError):
        raise EdgevitError(f"{path}: each image needs an integer id and a file_name.") from None
    present = {entry.name for entry in os.scandir(folder)}
    kept = [image for image in listed
            if image[1] in present or ("/" in image[1] and (folder / image[1]).is_file())]
    skipped[MISSING] += len(listed) - len(kept)
    if not kept:
        raise EdgevitError(f"None of the {len(listed)} images {path} lists is in {folder}.")
    all_ids = np.asarray([image[0] for image in listed], np.int64)
    unknown_images = ~np.isin(image_ids, all_ids)
    if unknown_images.any():
        raise EdgevitError(f"{path}: {int(unknown_images.sum())} annotation(s) of image ids its images do not list "
                           f"(e.g. {int(image_ids[unknown_images][0])}).")
    known = np.asarray(sorted(index_of), np.int64)
    unknown_categories = ~np.isin(category_ids, known)
    if unknown_categories.any():
        raise EdgevitError(f"{path}: {int(unknown_categories.sum())} annotation(s) of category ids its categories do "
                           f"not list (e.g. {int(category_ids[unknown_categories][0])}).")
    ids = np.asarray([image[0] for image in kept], np.int64)
    sizes = np.asarray([image[2:] for image in kept], np.float64)
    order = np.argsort(ids, kind="stable")
    position = np.searchsorted(ids[order], image_ids)
    found = (position < len(ids)) & (ids[order][np.minimum(position, len(ids) - 1)] == image_ids)
    image_of = np.where(found, order[np.minimum(position, len(ids) - 1)], -1)  # an image left out: -1
    corners = np.concatenate([bbox[:, :2], bbox[:, :2] + bbox[:, 2:]], 1)
    width, height = sizes[np.maximum(image_of, 0), 0], sizes[np.maximum(image_of, 0), 1]
    # an image without a recorded size keeps its boxes as they are (the transforms clip them to the crop)
    limit = np.stack([np.where(width > 0, width, np.inf), np.where(height > 0, height, np.inf)] * 2, 1)
    clipped = np.clip(corners, 0, limit)
    no_area = (bbox[:, 2] <= 0) | (bbox[:, 3] <= 0)
    outside = ~no_area & ((clipped[:, 2] <= clipped[:, 0]) | (clipped[:, 3] <= clipped[:, 1]))
    use = (image_of >= 0) & ~crowd
    skipped[CROWD] += int((crowd & (image_of >= 0)).sum())
    skipped[NO_AREA] += int((use & no_area).sum())
    skipped[OUTSIDE] += int((use & outside).sum())
    use &= ~no_area & ~outside
    classes_of = np.zeros(len(category_ids), np.int32)
    classes_of[use] = np.searchsorted(known, category_ids[use]) + 1
    files = [str(folder / image[1]) for image in kept]
    return names, _grouped(files, image_of[use], clipped[use], classes_of[use], len(names), skipped)


def _grouped(files: list[str], image_of: np.ndarray, corners: np.ndarray, box_classes: np.ndarray, classes: int,
             skipped: Counter) -> BoxSplit:
    """A split from every box's image index: each image's boxes together,
    in their order, the first MAX_BOXES kept."""
    order = np.argsort(image_of, kind="stable")
    image_of, corners, box_classes = image_of[order], corners[order], box_classes[order]
    starts = np.searchsorted(image_of, np.arange(len(files) + 1))
    rank = np.arange(len(image_of)) - starts[image_of]
    keep = rank < MAX_BOXES
    skipped[BEYOND] += int((~keep).sum())
    starts = np.searchsorted(image_of[keep], np.arange(len(files) + 1))
    return BoxSplit(files, corners[keep].astype(np.float32), box_classes[keep].astype(np.int32),
                    starts.astype(np.int64), classes)


# -- VOC ---------------------------------------------------------------------------------------------
def _voc_split(root: Path, name: str, classes: list[str], skipped: Counter) -> BoxSplit:
    listed = root / "ImageSets" / "Main" / f"{name}.txt"
    try:
        stems = [line.split()[0] for line in listed.read_text().splitlines() if line.strip()]
    except OSError:
        raise EdgevitError(f"{listed} is missing: a VOC devkit folder lists its {name} images there.") from None
    if not stems:
        raise EdgevitError(f"{listed} lists no images.")
    index_of = {class_name: i for i, class_name in enumerate(classes)}
    files, image_of, corners, box_classes = [], [], [], []
    for stem in stems:
        annotation = root / "Annotations" / f"{stem}.xml"
        try:
            tree = ElementTree.parse(annotation)
        except (OSError, ElementTree.ParseError) as err:
            raise EdgevitError(f"{annotation} cannot be read as VOC XML ({err.__class__.__name__}).") from None
        image = root / "JPEGImages" / (tree.findtext("filename") or f"{stem}.jpg")
        if not image.is_file():
            skipped[MISSING] += 1
            continue
        for obj in tree.iter("object"):
            class_name = (obj.findtext("name") or "").strip()
            if class_name not in index_of or index_of[class_name] == 0:
                raise EdgevitError(f"{annotation}: object {class_name!r} is not one of the classes "
                                   f"({', '.join(classes[1:4])} ...).")
            if (obj.findtext("difficult") or "0").strip() == "1":
                skipped[DIFFICULT] += 1
                continue
            try:
                # VOC counts pixels from 1
                x0, y0, x1, y1 = (float(obj.find("bndbox").findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
            except (AttributeError, TypeError, ValueError):
                raise EdgevitError(f"{annotation}: an object {class_name!r} without a numeric bndbox.") from None
            box = np.clip([x0 - 1, y0 - 1, x1, y1], 0, None)
            if box[2] <= box[0] or box[3] <= box[1]:
                skipped[NO_AREA] += 1
                continue
            image_of.append(len(files))
            corners.append(box)
            box_classes.append(index_of[class_name])
        files.append(str(image))
    if not files:
        raise EdgevitError(f"None of the images {listed} lists is in {root / 'JPEGImages'}.")
    return _grouped(files, np.asarray(image_of, np.int64), np.asarray(corners, np.float64).reshape(-1, 4),
                    np.asarray(box_classes, np.int32), len(classes), skipped)
