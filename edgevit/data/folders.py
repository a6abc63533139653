"""Image-folder datasets: ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``,
or ``DIR/<class>/*`` split with ``val_split``, for training; and the images an
evaluation scores: every image of ``DIR/val/<class>/*`` or ``DIR/<class>/*``.

A dataset is its file lists (paths and targets, see :class:`Split`):
nothing here opens an image. The images are listed by the one rule of
:mod:`edgevit.data.listing`, and read when the input pipeline asks for them
(:mod:`edgevit.data.stream`).
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
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

    def fingerprint(self) -> str:
        """A hash of the classes and of every image's path (relative to the
        root) and target in both splits: two workers that read other data,
        wherever their folders are, differ in it."""
        digest = hashlib.sha256(json.dumps(self.classes).encode())
        for split in (self.train, self.val):
            for path, label in zip(split.files, split.labels.tolist()):
                digest.update(os.fsencode(os.path.relpath(path, self.root)) + f"\0{label}\n".encode())
        return digest.hexdigest()[:16]


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


def _shown(name: str) -> str:
    """A folder name as text (a name that is not UTF-8 with its bytes escaped)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _refuse_shared_images(base: str, names: list[str]) -> None:
    """Refuse two class folders of ``base`` that hold the same images: one a
    symbolic link to the other, or leading into it (or both to one place):
    its files would be learnt, or scored, under two labels."""
    reals: dict[str, str] = {}
    for name in names:
        real = os.path.realpath(os.path.join(base, name))
        if real in reals:
            _refuse_pair(base, reals[real], name, "are one folder")
        reals[real] = name
    for real, name in reals.items():
        parent = os.path.dirname(real)
        while True:
            if parent in reals:
                _refuse_pair(base, reals[parent], name, f"hold the same images ('{_shown(name)}' leads into "
                                                        f"'{_shown(reals[parent])}')")
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)


def _refuse_pair(base: str, first: str, second: str, what: str) -> None:
    links = [f"'{_shown(name)}' is a symbolic link to {os.readlink(os.path.join(base, name))!r}"
             for name in (first, second) if os.path.islink(os.path.join(base, name))]
    raise EdgevitError(f"Class folders '{_shown(first)}' and '{_shown(second)}' in {base!r} {what}"
                       + (f" ({'; '.join(links)})" if links else "") + ": their images would count under two "
                       "labels; remove the link, or make it a folder of its own images.")


def _why_no_images(folder: str) -> str:
    """Why a class folder lists no image, in words that follow its name."""
    try:
        entries = [e for e in os.scandir(folder) if not e.name.startswith(".")]
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if not entries:
        return "is empty"
    return f"holds no image file ({len(entries)} other entr{'y' if len(entries) == 1 else 'ies'})"


def _images_by_class(base: str, layout: str, others: list[str] | None = None,
                     empty: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The image files of each class folder of ``base`` that holds at least
    one (listed once); an error naming the expected ``layout`` when none does.
    The class folders' other files are appended to ``others`` when given,
    and each class folder without images goes into ``empty`` with why."""
    by_class = {}
    names = _class_dirs(base)
    _refuse_shared_images(base, names)
    for name in names:
        files = image_paths(os.path.join(base, name), others)
        if not files:
            if empty is not None:
                empty[name] = _why_no_images(os.path.join(base, name))
            continue
        problem = label_problem(name)
        if problem:
            raise EdgevitError(f"Class folder '{_shown(name)}' in {base!r} cannot name a class: {problem} (class "
                               "folders name the labels of the converted model): rename the folder.")
        by_class[name] = files
    if not by_class:
        loose = " (its images lie directly in it: put each class in its own folder)" \
            if any(os.path.dirname(p) == base.rstrip(os.sep) for p in image_paths(base)) else ""
        raise EdgevitError(f"Dataset folder {base!r} has no images in class folders{loose}: expected {layout}.")
    return by_class


def empty_classes_summary(empty: dict[str, str]) -> str:
    """Class folders without images, each with why, in words."""
    named = [f"'{_shown(name)}' {why}" for name, why in list(empty.items())[:3]]
    return ", ".join(named) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")


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
    empty: dict[str, str] = {}
    by_class = _images_by_class(base, "train/<class>/*.jpg (and val/<class>/*.jpg) or <class>/*.jpg", others,
                                empty)
    classes = list(by_class)
    if len(classes) < 2:
        raise EdgevitError(f"Dataset folder {base!r} has images of one class only ({_shown(classes[0])})"
                           + (f"; {empty_classes_summary(empty)}" if empty else "")
                           + ": classification needs at least two class folders with images.")
    if empty:
        raise EdgevitError(f"Class folder(s) of {base!r} without images: {empty_classes_summary(empty)}; each class "
                           "folder names a label of the trained model: add images, or move the folder out.")
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
    kept = np.bincount(train.labels[train_idx], minlength=len(classes))
    if not kept.all():
        left = [name for name, images in zip(classes, kept) if not images]
        raise EdgevitError(f"--val-split {fraction:g} holds out every image of class(es) "
                           f"{', '.join(map(_shown, left[:3]))}{' ...' if len(left) > 3 else ''} "
                           f"({len(train.files)} images in {len(classes)} classes): they would have no training "
                           "image; pass a smaller --val-split, or add images.")
    return ImageFolder(root, classes, Split([train.files[i] for i in train_idx], train.labels[train_idx]),
                       Split([train.files[i] for i in val_idx], train.labels[val_idx]),
                       f"{fraction:.0%} of {os.path.basename(base)}/ held out (seed {seed})", _relative(others, root))


def _relative(paths: list[str], root: str) -> list[str]:
    """``paths`` relative to ``root``, a folder link's closing separator kept."""
    return sorted(os.path.relpath(p, root) + (os.sep if p.endswith(os.sep) else "") for p in paths)


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
    empty: dict[str, str] = {}
    by_class = _images_by_class(base, "val/<class>/*.jpg or <class>/*.jpg", others, empty)
    if empty:
        warnings.warn(f"class folder(s) of {base} without images, not scored: {empty_classes_summary(empty)}",
                      stacklevel=2)
    return EvaluationImages(list(by_class), _split(by_class, list(by_class)), source, _relative(others, root))
