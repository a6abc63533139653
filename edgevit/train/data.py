"""Image-folder datasets: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``,
or ``DIR/<class>/*`` split with ``val_split``.

Images are decoded once with :mod:`edgevit.data.images` (resized so the
shorter side is the preprocessing's resize size at the largest resolution
asked for, center square kept) and held in memory as uint8; batches are
cropped from them: random crop + mirror for training, center crop for
evaluation, as in the reference training recipes. Unreadable files are
skipped and counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.images import center_crop, image_files, normalise, read_crops
from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing


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


def find_dataset(root: str | Path, val_split: float | None = None, seed: int = 0) -> ImageFolder:
    """Discover classes and files; one clear error for each unusable layout."""
    root = Path(root)
    if not root.exists():
        raise EdgevitError(f"Dataset folder {str(root)!r} does not exist.")
    if not root.is_dir():
        raise EdgevitError(f"Dataset path {str(root)!r} is not a folder.")
    has_split = (root / "train").is_dir()
    base = root / "train" if has_split else root
    classes = [d.name for d in _class_dirs(base)]
    classes = [c for c in classes if image_files(base / c)]
    if not classes:
        raise EdgevitError(f"Dataset folder {str(root)!r} has no images: expected train/<class>/*.jpg "
                           "(and val/<class>/*.jpg) or <class>/*.jpg.")
    if len(classes) < 2:
        raise EdgevitError(f"Dataset folder {str(base)!r} has one class only ({classes[0]}); "
                           "classification needs at least two class folders.")
    _, train_files, train_labels = _scan(base, classes)
    if has_split and (root / "val").is_dir() and val_split is None:
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


def decode(files: list[Path], labels: np.ndarray, shorter_side: int, interpolation: str = "bilinear"):
    """uint8 images resized (shorter side) and center-cropped to a square of
    ``shorter_side``; unreadable files are skipped. Returns (images, labels,
    names of skipped files)."""
    images, kept, skipped = [], [], []
    for path, label, pixels in zip(files, labels, read_crops(files, shorter_side, shorter_side, interpolation)):
        if pixels is None:
            skipped.append(str(path))
            continue
        images.append(pixels)
        kept.append(label)
    if not images:
        raise EdgevitError("None of the images could be read.")
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


def load_split(split: Split, pre: Preprocessing, max_size: int) -> tuple[ArrayData, list[str]]:
    """Decode a split once, large enough for crops up to ``max_size``."""
    side = round(max_size * pre.resize_size / pre.input_size)
    images, labels, skipped = decode(split.files, split.labels, side, pre.interpolation)
    return ArrayData(images, labels, pre), skipped
