"""Image-folder datasets: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``,
or ``DIR/<class>/*`` split with ``val_split``, for training; and the images an
evaluation scores: every image of ``DIR/val/<class>/*`` or ``DIR/<class>/*``.

A dataset is its file list (paths and labels); nothing here holds an image.
Each image is made when the input pipeline (:mod:`edgevit.train.pipeline`)
asks for it, by the transforms below: read with :mod:`edgevit.data.images`,
resized so the shorter side is the preprocessing's resize size at the
largest resolution asked for, center square kept (the *stored square*, as
the reference training recipes decode once); then a random resized crop and
mirror for training, or a center crop for evaluation. Unreadable files are
skipped and counted by reason where they are met (:class:`SkipTally`).
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np
from PIL import Image

from edgevit.data.images import (IMAGE_SUFFIXES, SkippedImages, UnreadableImage, center_crop, open_rgb)
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing
from edgevit.saving import label_problem

# The random resized crop keeps this fraction of the stored square's area at least (the MobileViT recipes' 0.35).
MIN_CROP_AREA = 0.35


@dataclass
class Split:
    files: list[str]
    labels: np.ndarray


@dataclass
class ImageFolder:
    root: str
    classes: list[str]
    train: Split
    val: Split
    val_source: str
    left_out: list[str]     # files of the class folders without an image suffix, named relative to root


def image_paths(folder: str, others: list[str] | None = None) -> list[str]:
    """Image files below ``folder``, recursively, sorted, hidden entries left
    out, as strings (a million Path objects cost seconds and hundreds of MB).
    Symbolic links to folders are not followed (a link back up would loop);
    a link to a file is listed even when it leads nowhere, and is counted as
    unreadable when an image is read from it. Files without an image suffix
    are appended to ``others`` when given."""
    found, pending = [], [folder]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:  # a folder removed or closed to us meanwhile: its images are not there to train on
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_folder = False
            if is_folder:
                pending.append(entry.path)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                found.append(entry.path)
            elif others is not None:
                others.append(entry.path)
    found.sort()
    return found


def _class_dirs(folder: str) -> list[str]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())


def _existing_folder(root: str | os.PathLike) -> str:
    root = os.fspath(root)
    if not os.path.exists(root):
        raise EdgevitError(f"Dataset folder {root!r} does not exist.")
    if not os.path.isdir(root):
        raise EdgevitError(f"Dataset path {root!r} is not a folder.")
    return root


def _images_by_class(base: str, layout: str, others: list[str] | None = None) -> dict[str, list[str]]:
    """The image files of each class folder of ``base`` that holds at least
    one (listed once); an error naming the expected ``layout`` when none does.
    The class folders' other files are appended to ``others`` when given."""
    by_class = {}
    for name in _class_dirs(base):
        files = image_paths(os.path.join(base, name), others)
        if not files:
            continue
        problem = label_problem(name)
        if problem:
            shown = os.fsencode(name).decode("utf-8", "backslashreplace")
            raise EdgevitError(f"Class folder '{shown}' in {base!r} cannot name a class: {problem} (class "
                               "folders name the labels of the converted model): rename the folder.")
        by_class[name] = files
    if not by_class:
        loose = " (its images lie directly in it: put each class in its own folder)" \
            if any(os.path.dirname(p) == base.rstrip(os.sep) for p in image_paths(base)) else ""
        raise EdgevitError(f"Dataset folder {base!r} has no images in class folders{loose}: expected {layout}.")
    return by_class


def _split(by_class: dict[str, list[str]], classes: list[str]) -> Split:
    files, labels = [], []
    for index, name in enumerate(classes):
        files += by_class.get(name, [])
        labels.append(np.full(len(by_class.get(name, [])), index, np.int64))
    return Split(files, np.concatenate(labels))


def find_dataset(root: str | os.PathLike, val_split: float | None = None, seed: int = 0) -> ImageFolder:
    """Discover classes and files; one clear error for each unusable layout."""
    root = _existing_folder(root)
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    has_split = os.path.isdir(train_dir)
    if not has_split and os.path.isdir(val_dir):
        raise EdgevitError(f"Dataset folder {root!r} has val/ but no train/: training reads "
                           "train/<class>/*.jpg (and val/<class>/*.jpg), or <class>/*.jpg with --val-split.")
    if has_split and os.path.isdir(val_dir) and val_split is not None:
        raise EdgevitError(f"Dataset folder {root!r} has val/, which validates the training; --val-split "
                           "holds out part of the training images only where there is none: leave it out.")
    base = train_dir if has_split else root
    others: list[str] = []
    by_class = _images_by_class(base, "train/<class>/*.jpg (and val/<class>/*.jpg) or <class>/*.jpg", others)
    classes = list(by_class)
    if len(classes) < 2:
        empty = [name for name in _class_dirs(base) if name not in classes]
        raise EdgevitError(f"Dataset folder {base!r} has images of one class only ({classes[0]})"
                           + (f"; {', '.join(empty[:3])} {'has' if len(empty) == 1 else 'have'} none"
                              if empty else "")
                           + ": classification needs at least two class folders with images.")
    train = _split(by_class, classes)
    if has_split and os.path.isdir(val_dir):
        extra = sorted(set(_class_dirs(val_dir)) - set(classes))
        if extra:
            raise EdgevitError(f"val/ has classes that train/ lacks: {', '.join(extra[:5])}.")
        val = _split({name: image_paths(os.path.join(val_dir, name), others) for name in classes}, classes)
        if not val.files:
            raise EdgevitError(f"{val_dir!r} has no images.")
        return ImageFolder(root, classes, train, val, "val/", _relative(others, root))
    fraction = 0.1 if val_split is None else float(val_split)
    if not 0.0 < fraction < 1.0:
        raise EdgevitError(f"--val-split must be between 0 and 1, got {fraction}.")
    order = np.random.default_rng(seed).permutation(len(train.files))
    count = max(1, int(round(len(order) * fraction)))
    if count >= len(order):
        raise EdgevitError(f"Too few images in {base!r} to hold out a validation split.")
    val_idx, train_idx = np.sort(order[:count]), np.sort(order[count:])
    return ImageFolder(root, classes, Split([train.files[i] for i in train_idx], train.labels[train_idx]),
                       Split([train.files[i] for i in val_idx], train.labels[val_idx]),
                       f"{fraction:.0%} of {os.path.basename(base)}/ held out (seed {seed})", _relative(others, root))


def _relative(paths: list[str], root: str) -> list[str]:
    return sorted(os.path.relpath(p, root) for p in paths)


def left_out_summary(left_out: list[str]) -> str:
    """The files of the class folders without an image suffix, in words."""
    names = ", ".join(left_out[:3]) + (" ..." if len(left_out) > 3 else "")
    return (f"{len(left_out)} file(s) without an image suffix ({', '.join(sorted(IMAGE_SUFFIXES))}) left out: "
            f"{names}")


@dataclass
class EvaluationImages:
    classes: list[str]      # the class folders, sorted
    split: Split
    source: str             # which images, in words
    left_out: list[str]     # files of the class folders without an image suffix, named relative to root


def find_evaluation_images(root: str | os.PathLike) -> EvaluationImages:
    """Every image an evaluation of ``root`` scores: ``root/val/<class>/*``
    when there is a val/ folder, otherwise ``root/<class>/*``, all of them."""
    root = _existing_folder(root)
    if os.path.isdir(os.path.join(root, "val")):
        base, source = os.path.join(root, "val"), "val/"
    elif os.path.isdir(os.path.join(root, "train")):
        raise EdgevitError(f"Dataset folder {root!r} has train/ but no val/: evaluation scores "
                           f"val/<class>/*.jpg or <class>/*.jpg; pass {os.path.join(root, 'train')!r} to score the "
                           "training images.")
    else:
        base, source = root, "every image"
    others: list[str] = []
    by_class = _images_by_class(base, "val/<class>/*.jpg or <class>/*.jpg", others)
    return EvaluationImages(list(by_class), _split(by_class, list(by_class)), source, _relative(others, root))


class SkipTally:
    """The unreadable files an input pipeline has met, each counted once
    however often it is met, by reason; safe to add to from the pipeline's
    threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.skipped = SkippedImages()

    def add(self, err: UnreadableImage) -> None:
        with self._lock:
            if str(err.path) not in self._seen:
                self._seen.add(str(err.path))
                self.skipped.add(err)

    def __len__(self) -> int:
        return len(self._seen)


def stored_square(path: str, side: int, interpolation: str) -> np.ndarray:
    """uint8 ``[side, side, 3]``: the image resized (shorter side) and
    center-cropped to a square of ``side``; :class:`UnreadableImage` when it
    cannot be read."""
    return np.asarray(center_crop(open_rgb(path), side, side, interpolation), np.uint8)


def training_crop(square: np.ndarray, crop: int, x0: int, y0: int, size: int, mirror: bool) -> np.ndarray:
    """The random resized crop: the ``crop`` square at (``x0``, ``y0``) of
    the stored square, resized to ``size`` (bilinear), mirrored when asked."""
    pixels = np.asarray(Image.fromarray(square[y0:y0 + crop, x0:x0 + crop]).resize(
        (size, size), Image.Resampling.BILINEAR))
    return pixels[:, ::-1] if mirror else pixels


def crop_box(side: int, draws) -> tuple[int, int, int]:
    """(crop, x0, y0) of a random resized crop of a ``side`` square from
    three uniform draws in [0, 1): an area of MIN_CROP_AREA to 1 of the
    square, anywhere in it."""
    crop = int(side * math.sqrt(MIN_CROP_AREA + (1.0 - MIN_CROP_AREA) * float(draws[0])))
    span = side - crop + 1
    return crop, min(int(float(draws[1]) * span), span - 1), min(int(float(draws[2]) * span), span - 1)


def evaluation_crop(square: np.ndarray, pre: Preprocessing, size: int) -> np.ndarray:
    """Center crop: resize the stored square to the evaluation resize size
    for ``size``, crop ``size`` (the registered evaluation transform)."""
    resize = round(size * pre.resize_size / pre.input_size)
    return np.asarray(center_crop(Image.fromarray(square), resize, size, pre.interpolation))


def stored_side(pre: Preprocessing, max_size: int) -> int:
    """The stored square's side for crops up to ``max_size``."""
    return round(max_size * pre.resize_size / pre.input_size)
