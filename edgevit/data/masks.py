"""Segmentation datasets: images with their masks, in either layout users
have:

- ``DIR/classes.txt`` (one class name a line, index 0 first) with
  ``DIR/train/images/*.jpg`` and ``DIR/train/masks/*.png`` (the same stem),
  and the same for ``DIR/val/``;
- a Pascal VOC devkit folder as it is: ``JPEGImages/``,
  ``SegmentationClass/`` and ``ImageSets/Segmentation/{train,val}.txt``
  (VOC's 21 class names, or ``classes.txt`` beside them).

A mask holds a class index per pixel, 255 where no class counts (VOC's
object borders): an 8-bit grayscale PNG, or a palette PNG whose palette is
VOC's colour map (its indices are the classes, as in VOC's
``SegmentationClass``) or a gray ramp. :func:`read_mask` refuses every
other kind with a reason, which the input pipeline counts as it counts an
unreadable image (:class:`~edgevit.data.decode.UnreadableTally`): a mask
that does not fit its image, an index beyond the classes, a 16-bit or
colour mask, a palette that is neither.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from edgevit.data.decode import SIXTEEN_BIT_MODES, UnreadableImage, reading
from edgevit.data.labels import label_problem
from edgevit.data.listing import IMAGE_SUFFIXES
from edgevit.errors import EdgevitError

# The mask value of pixels no class counts (VOC's object borders and "difficult" regions).
IGNORE_INDEX = 255
# Class indices a mask can hold besides IGNORE_INDEX.
MAX_CLASSES = 255
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")

# Why a mask is left out, with its image (counted by these, as unreadable images are).
MASK_SIZE = "a mask whose size differs from its image's"
MASK_INDEX = "a mask with a class index beyond classes.txt (other than 255)"
MASK_DEPTH = "a 16-bit mask (masks are 8-bit class indices)"
MASK_COLOUR = "a colour mask (masks hold class indices: 8-bit grayscale, or a palette PNG)"
MASK_PALETTE = ("a palette mask whose palette is neither VOC's colour map nor a gray ramp (its indices may not be "
                "classes)")


@dataclass
class MaskSplit:
    """The images of a split and their masks, in the same order, of ``classes`` classes."""
    files: list[str]
    masks: list[str]
    classes: int


@dataclass(frozen=True)
class MaskFile:
    """A mask as the target of its image: read (:func:`read_mask`) when the
    image is, against the image's size."""
    path: str
    classes: int


@dataclass
class SegmentationFolder:
    root: str
    classes: list[str]
    train: MaskSplit
    val: MaskSplit
    layout: str             # which layout, in words
    left_out: list[str] = field(default_factory=list)   # (a segmentation folder names its images: none left out)

    @property
    def val_source(self) -> str:
        return f"val of a {self.layout} folder"

    def fingerprint(self) -> str:
        """A hash of the classes and of every image's and mask's path
        (relative to the root) in both splits: two workers that read other
        data, wherever their folders are, differ in it."""
        digest = hashlib.sha256(json.dumps(self.classes).encode())
        for split in (self.train, self.val):
            for image, mask in zip(split.files, split.masks):
                digest.update(os.fsencode(os.path.relpath(image, self.root)) + b"\0" +
                              os.fsencode(os.path.relpath(mask, self.root)) + b"\n")
        return digest.hexdigest()[:16]


def voc_colour_map(entries: int = 256) -> np.ndarray:
    """[entries, 3] uint8: VOC's palette, whose index i is class i (the bits
    of i spread over the high bits of red, green and blue)."""
    colours = np.zeros((entries, 3), np.uint8)
    for index in range(entries):
        value, shift = index, 7
        while value:
            for channel in range(3):
                colours[index, channel] |= ((value >> channel) & 1) << shift
            value >>= 3
            shift -= 1
    return colours


_VOC_PALETTE = voc_colour_map()
_GRAY_RAMP = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, 1)


def read_classes(path: Path) -> list[str]:
    """The class names of ``classes.txt``: one a line, index 0 first; an
    error naming the file for a duplicate, an empty or unusable name, or
    more than MAX_CLASSES."""
    try:
        names = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise EdgevitError(f"{path} cannot be read as UTF-8 text ({err.__class__.__name__}).") from None
    while names and not names[-1].strip():
        names.pop()  # a trailing blank line
    if len(names) < 2:
        raise EdgevitError(f"{path} names {len(names)} class(es): segmentation needs at least two (one a line, "
                           "index 0 first, usually 'background').")
    if len(names) > MAX_CLASSES:
        raise EdgevitError(f"{path} names {len(names)} classes: masks hold at most {MAX_CLASSES} (255 marks "
                           "pixels no class counts).")
    seen: dict[str, int] = {}
    for line, name in enumerate(names, 1):
        problem = label_problem(name)
        if problem:
            raise EdgevitError(f"{path}, line {line}: {name!r} cannot name a class: {problem}.")
        if name in seen:
            raise EdgevitError(f"{path} names {name!r} twice (lines {seen[name]} and {line}): each class once.")
        seen[name] = line
    return names


def _paired(images_dir: Path, masks_dir: Path, classes: int) -> MaskSplit:
    """The images of ``images_dir`` with the same-stem PNGs of ``masks_dir``;
    an error naming the images without a mask."""
    images = sorted(p for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES
                    and not p.name.startswith(".")) if images_dir.is_dir() else []
    masks = {p.stem: p for p in masks_dir.iterdir() if p.suffix.lower() == ".png"} if masks_dir.is_dir() else {}
    if not images:
        raise EdgevitError(f"{images_dir} has no images.")
    alone = [p.name for p in images if p.stem not in masks]
    if alone:
        raise EdgevitError(f"{len(alone)} image(s) of {images_dir} have no mask {masks_dir}/<same name>.png: "
                           f"{', '.join(alone[:3])}{' ...' if len(alone) > 3 else ''}.")
    return MaskSplit([str(p) for p in images], [str(masks[p.stem]) for p in images], classes)


def _voc_split(root: Path, name: str, classes: int) -> MaskSplit:
    listed = root / "ImageSets" / "Segmentation" / f"{name}.txt"
    try:
        stems = [line.strip() for line in listed.read_text().splitlines() if line.strip()]
    except OSError:
        raise EdgevitError(f"{listed} is missing: a VOC devkit folder lists its {name} images there.") from None
    files, masks = [], []
    for stem in stems:
        image, mask = root / "JPEGImages" / f"{stem}.jpg", root / "SegmentationClass" / f"{stem}.png"
        if not mask.exists():
            raise EdgevitError(f"{listed} lists {stem}, which has no mask {mask}.")
        files.append(str(image))
        masks.append(str(mask))
    if not files:
        raise EdgevitError(f"{listed} lists no images.")
    return MaskSplit(files, masks, classes)


def is_segmentation_folder(root: str | os.PathLike) -> bool:
    """Whether ``root`` is laid out as a segmentation dataset (either layout)."""
    root = Path(root)
    return (root / "classes.txt").is_file() or (root / "SegmentationClass").is_dir()


def find_segmentation_dataset(root: str | os.PathLike) -> SegmentationFolder:
    """The classes and the image-mask pairs of ``root``; one clear error for each unusable layout."""
    root = Path(root)
    if not root.is_dir():
        raise EdgevitError(f"Dataset folder {str(root)!r} does not exist or is not a folder.")
    classes_file = root / "classes.txt"
    if (root / "SegmentationClass").is_dir():
        classes = read_classes(classes_file) if classes_file.exists() else list(VOC_CLASSES)
        return SegmentationFolder(str(root), classes, _voc_split(root, "train", len(classes)),
                                  _voc_split(root, "val", len(classes)),
                                  "VOC devkit (ImageSets/Segmentation)")
    if not classes_file.is_file():
        raise EdgevitError(f"Dataset folder {str(root)!r} has no classes.txt: a segmentation folder names its "
                           "classes there, one a line (or is a VOC devkit folder with SegmentationClass/).")
    classes = read_classes(classes_file)
    splits = [_paired(root / split / "images", root / split / "masks", len(classes)) for split in ("train", "val")]
    return SegmentationFolder(str(root), classes, *splits, "train/ and val/ with images/ and masks/")


def _palette_means_classes(mask: Image.Image) -> bool:
    """Whether a palette mask's colours, at the indices it uses, are VOC's
    colour map or a gray ramp: then its indices are its classes (a mask
    drawn in colours and saved as a palette of whatever colours came first
    is not)."""
    if mask.palette is None or mask.palette.mode != "RGB":
        return False
    palette = np.frombuffer(mask.palette.tobytes(), np.uint8)[:768].reshape(-1, 3)
    used = np.unique(np.asarray(mask))
    if used.max() >= len(palette):
        return False
    return any(np.array_equal(palette[used], reference[used]) for reference in (_VOC_PALETTE, _GRAY_RAMP))


def read_mask(path: str | os.PathLike, image_size: tuple[int, int], classes: int) -> Image.Image:
    """The mask at ``path`` as an 8-bit image of class indices (mode "L")
    for an image of ``image_size``; :class:`UnreadableImage` with one of the
    MASK_* reasons (or the decoder's) when it cannot serve."""
    with reading(path), Image.open(path) as mask:
        mask.load()
    if mask.mode in SIXTEEN_BIT_MODES or mask.mode == "F":
        raise UnreadableImage(path, MASK_DEPTH)
    if mask.mode == "P":
        if not _palette_means_classes(mask):
            raise UnreadableImage(path, MASK_PALETTE)
        indices = Image.fromarray(np.asarray(mask), "L")
    elif mask.mode == "L":
        indices = mask
    else:
        raise UnreadableImage(path, MASK_COLOUR)
    if indices.size != tuple(image_size):
        raise UnreadableImage(path, MASK_SIZE)
    values = np.asarray(indices)
    if np.any((values >= classes) & (values != IGNORE_INDEX)):
        raise UnreadableImage(path, MASK_INDEX)
    return indices
