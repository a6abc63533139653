"""Image-folder datasets: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``,
or ``DIR/<class>/*`` split with ``val_split``, for training; and the images an
evaluation scores: every image of ``DIR/val/<class>/*`` or ``DIR/<class>/*``.

A dataset is its file lists (paths and targets, see :class:`Split`):
nothing here opens an image. The images are listed by the one rule of
:mod:`edgevit.data.listing`, and read when the input pipeline asks for them
(:mod:`edgevit.data.stream`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from edgevit.data.labels import label_problem
from edgevit.data.listing import image_paths
from edgevit.errors import EdgevitError


@dataclass
class Split:
    """The images of a split and their targets, in the same order."""
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
