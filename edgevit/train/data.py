"""Image-folder datasets: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``,
or ``DIR/<class>/*`` split with ``val_split``, for training; and the images an
evaluation scores: every image of ``DIR/val/<class>/*`` or ``DIR/<class>/*``.

Images are decoded once with :mod:`edgevit.data.images` (resized so the
shorter side is the preprocessing's resize size at the largest resolution
asked for, center square kept) and held in memory as uint8; batches are
cropped from them: random crop + mirror for training, center crop for
evaluation, as in the reference training recipes. Unreadable files are
skipped and counted.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.images import SkippedImages, UnreadableImage, center_crop, image_files, normalise, read_crops
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing
from edgevit.saving import label_problem


@dataclass
class Split:
    files: list[Path]
    labels: np.ndarray


@dataclass
class ImageFolder:
    root: Path
    classes: list[str]
    train: Split
    val: Split
    val_source: str
    skipped: list[str] = field(default_factory=list)


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _scan(folder: Path, classes: list[str] | None = None) -> tuple[list[str], list[Path], np.ndarray]:
    dirs = _class_dirs(folder)
    names = classes or [d.name for d in dirs]
    files, labels = [], []
    for index, name in enumerate(names):
        images = image_files(folder / name) if (folder / name).is_dir() else []
        files += images
        labels += [index] * len(images)
    return names, files, np.asarray(labels, np.int64)


def _existing_folder(root: str | Path) -> Path:
    root = Path(root)
    if not root.exists():
        raise EdgevitError(f"Dataset folder {str(root)!r} does not exist.")
    if not root.is_dir():
        raise EdgevitError(f"Dataset path {str(root)!r} is not a folder.")
    return root


def _classes_with_images(base: Path, layout: str) -> list[str]:
    """Class folders of ``base`` holding at least one image; an error naming
    the expected ``layout`` when there are none."""
    classes = [d.name for d in _class_dirs(base) if image_files(d)]
    for name in classes:
        problem = label_problem(name)
        if problem:
            shown = os.fsencode(name).decode("utf-8", "backslashreplace")
            raise EdgevitError(f"Class folder '{shown}' in {str(base)!r} cannot name a class: {problem} (class "
                               "folders name the labels of the converted model): rename the folder.")
    if not classes:
        loose = " (its images lie directly in it: put each class in its own folder)" \
            if any(p.parent == base for p in image_files(base)) else ""
        raise EdgevitError(f"Dataset folder {str(base)!r} has no images in class folders{loose}: "
                           f"expected {layout}.")
    return classes


def find_dataset(root: str | Path, val_split: float | None = None, seed: int = 0) -> ImageFolder:
    """Discover classes and files; one clear error for each unusable layout."""
    root = _existing_folder(root)
    has_split = (root / "train").is_dir()
    if not has_split and (root / "val").is_dir():
        raise EdgevitError(f"Dataset folder {str(root)!r} has val/ but no train/: training reads "
                           "train/<class>/*.jpg (and val/<class>/*.jpg), or <class>/*.jpg with --val-split.")
    if has_split and (root / "val").is_dir() and val_split is not None:
        raise EdgevitError(f"Dataset folder {str(root)!r} has val/, which validates the training; --val-split "
                           "holds out part of the training images only where there is none: leave it out.")
    base = root / "train" if has_split else root
    classes = _classes_with_images(base, "train/<class>/*.jpg (and val/<class>/*.jpg) or <class>/*.jpg")
    if len(classes) < 2:
        empty = [d.name for d in _class_dirs(base) if d.name not in classes]
        raise EdgevitError(f"Dataset folder {str(base)!r} has images of one class only ({classes[0]})"
                           + (f"; {', '.join(empty[:3])} {'has' if len(empty) == 1 else 'have'} none"
                              if empty else "")
                           + ": classification needs at least two class folders with images.")
    _, train_files, train_labels = _scan(base, classes)
    if has_split and (root / "val").is_dir():
        extra = sorted(set(d.name for d in _class_dirs(root / "val")) - set(classes))
        if extra:
            raise EdgevitError(f"val/ has classes that train/ lacks: {', '.join(extra[:5])}.")
        _, val_files, val_labels = _scan(root / "val", classes)
        if not val_files:
            raise EdgevitError(f"{str(root / 'val')!r} has no images.")
        return ImageFolder(root, classes, Split(train_files, train_labels), Split(val_files, val_labels),
                           "val/")
    fraction = 0.1 if val_split is None else float(val_split)
    if not 0.0 < fraction < 1.0:
        raise EdgevitError(f"--val-split must be between 0 and 1, got {fraction}.")
    order = np.random.default_rng(seed).permutation(len(train_files))
    count = max(1, int(round(len(order) * fraction)))
    if count >= len(order):
        raise EdgevitError(f"Too few images in {str(base)!r} to hold out a validation split.")
    val_idx, train_idx = np.sort(order[:count]), np.sort(order[count:])
    files = np.asarray(train_files, dtype=object)
    return ImageFolder(root, classes, Split(list(files[train_idx]), train_labels[train_idx]),
                       Split(list(files[val_idx]), train_labels[val_idx]),
                       f"{fraction:.0%} of {base.name}/ held out (seed {seed})")


@dataclass
class EvaluationImages:
    classes: list[str]      # the class folders, sorted
    split: Split
    source: str             # which images, in words


def find_evaluation_images(root: str | Path) -> EvaluationImages:
    """Every image an evaluation of ``root`` scores: ``root/val/<class>/*``
    when there is a val/ folder, otherwise ``root/<class>/*``, all of them."""
    root = _existing_folder(root)
    if (root / "val").is_dir():
        base, source = root / "val", "val/"
    elif (root / "train").is_dir():
        raise EdgevitError(f"Dataset folder {str(root)!r} has train/ but no val/: evaluation scores "
                           f"val/<class>/*.jpg or <class>/*.jpg; pass {str(root / 'train')!r} to score the "
                           "training images.")
    else:
        base, source = root, "every image"
    classes = _classes_with_images(base, "val/<class>/*.jpg or <class>/*.jpg")
    _, files, labels = _scan(base, classes)
    return EvaluationImages(classes, Split(files, labels), source)


def decode(files: list[Path], labels: np.ndarray, shorter_side: int, interpolation: str = "bilinear"):
    """uint8 images resized (shorter side) and center-cropped to a square of
    ``shorter_side``; unreadable files are skipped. Returns (images, labels,
    the skipped files)."""
    images, kept, skipped = [], [], SkippedImages()
    for label, pixels in zip(labels, read_crops(files, shorter_side, shorter_side, interpolation)):
        if isinstance(pixels, UnreadableImage):
            skipped.add(pixels)
            continue
        images.append(pixels)
        kept.append(label)
    if not images:
        raise EdgevitError(f"None of the {len(files)} images could be read"
                           + (f": {skipped.summary()}." if skipped else "."))
    return np.stack(images), np.asarray(kept, np.int64), skipped


class ArrayData:
    """Decoded images of one split, cropped into model inputs on demand."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, pre: Preprocessing):
        self.images, self.labels, self.pre = images, labels, pre

    def __len__(self):
        return len(self.images)

    def eval_batch(self, index, size: int) -> np.ndarray:
        """Center crop: resize the stored square to the eval resize size for
        ``size``, crop ``size`` (the registered evaluation transform)."""
        resize = round(size * self.pre.resize_size / self.pre.input_size)
        out = [np.asarray(center_crop(Image.fromarray(img), resize, size, self.pre.interpolation))
               for img in self.images[index]]
        return normalise(np.stack(out), self.pre)

    def train_batch(self, index, size: int, rng: np.random.Generator) -> np.ndarray:
        """Random resized crop (scale 0.35-1 of the area, as the MobileViT
        recipes use) and a random mirror."""
        out = []
        for img in self.images[index]:
            side = img.shape[0]
            crop = int(side * math.sqrt(rng.uniform(0.35, 1.0)))
            x0, y0 = rng.integers(0, side - crop + 1, size=2)
            im = Image.fromarray(img[y0:y0 + crop, x0:x0 + crop]).resize((size, size), Image.Resampling.BILINEAR)
            arr = np.asarray(im)
            if rng.random() < 0.5:
                arr = arr[:, ::-1]
            out.append(arr)
        return normalise(np.stack(out), self.pre)


def load_split(split: Split, pre: Preprocessing, max_size: int) -> tuple[ArrayData, SkippedImages]:
    """Decode a split once, large enough for crops up to ``max_size``."""
    side = round(max_size * pre.resize_size / pre.input_size)
    images, labels, skipped = decode(split.files, split.labels, side, pre.interpolation)
    return ArrayData(images, labels, pre), skipped
