"""Reading images into model inputs with a model's own preprocessing.

edgevit's one image path: opening files (:func:`open_rgb`), the evaluation
resize and center crop (:func:`center_crop`) and the normalisation
(:func:`normalise`) serve the export calibration and validation sets, the
sample photos and the training data (``edgevit.train.data`` adds only its
training augmentation). Files that cannot be read are skipped and counted by
reason (:class:`SkippedImages`), never a traceback.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from edgevit.errors import EdgevitError, not_there
from edgevit.registry import Preprocessing

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}

_PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}
# the resampling filters a preprocessing recipe may name
INTERPOLATIONS = tuple(_PIL_FILTERS)


# Why an image file was skipped, in a few words (skipped files are counted by these).
NOT_AN_IMAGE = "not an image, or damaged"
NOT_OPENED = "could not be opened (removed, no permission, or a link that leads nowhere)"
TOO_LARGE = "more pixels than Pillow's decompression-bomb limit"
FLOAT_PIXELS = "floating-point pixels (no 8-bit scale)"
UNCONVERTIBLE = "a colour mode with no RGB conversion"
# Pillow's modes for 16-bit grayscale (PNG, TIFF; "I" holds it in 32 bits).
SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
# Up to this aspect ratio (16:1) the evaluation resize makes the whole
# resized image (at 288 px: 1.3 M pixels, 4 MB) and crops it, as the
# reference code does; beyond, it resizes the cropped part alone, which
# rounds a pixel value or two differently.
MAX_RESIZED_SIDES = 16


class UnreadableImage(Exception):
    """An image file that is skipped, with the reason (one of the constants above)."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


class SkippedImages:
    """The files left out of an image set because they could not be read, by reason."""

    def __init__(self):
        self.by_reason: dict[str, list[Path]] = {}

    def add(self, err: UnreadableImage) -> None:
        self.by_reason.setdefault(err.reason, []).append(err.path)

    def __len__(self) -> int:
        return sum(len(paths) for paths in self.by_reason.values())

    def __add__(self, other: SkippedImages) -> SkippedImages:
        merged = SkippedImages()
        for tally in (self, other):
            for reason, paths in tally.by_reason.items():
                merged.by_reason.setdefault(reason, []).extend(paths)
        return merged

    def counts(self) -> dict[str, int]:
        return {reason: len(paths) for reason, paths in self.by_reason.items()}

    def summary(self) -> str:
        """E.g. ``3 unreadable image(s) skipped: 2 not an image, or damaged (a.jpg, b.jpg); 1 ...``."""
        parts = []
        for reason, paths in self.by_reason.items():
            names = ", ".join(p.name for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
            parts.append(f"{len(paths)} {reason} ({names})")
        return f"{len(self)} unreadable image(s) skipped: " + "; ".join(parts)


def _visible_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def image_files(folder: str | Path) -> list[Path]:
    """Image files below ``folder`` (recursively, sorted, hidden files left out)."""
    return [p for p in _visible_files(Path(folder)) if is_image_file(p)]


def list_images(folder: str | Path) -> list[Path]:
    """Image files below ``folder`` (recursively, sorted). Files with other
    suffixes are skipped with one warning that counts them."""
    folder = Path(folder)
    if not folder.exists():
        raise EdgevitError(f"Image folder {str(folder)!r} {not_there(folder)}.")
    if not folder.is_dir():
        raise EdgevitError(f"{str(folder)!r} is not a folder of images.")
    files = _visible_files(folder)
    images = [p for p in files if is_image_file(p)]
    skipped = len(files) - len(images)
    if skipped:
        warnings.warn(f"{skipped} non-image file(s) in {folder} skipped", stacklevel=2)
    if not images:
        raise EdgevitError(f"Image folder {str(folder)!r} contains no images "
                           f"(looked for {', '.join(sorted(IMAGE_SUFFIXES))}).")
    return images


def open_rgb(path: str | Path) -> Image.Image:
    """An image file as 8-bit RGB, upright, as the Android demo sees it: EXIF
    orientation applied, 16-bit grayscale scaled to 8 bits, palette, CMYK and
    grayscale converted, alpha dropped (the app ignores it too). Raises
    :class:`UnreadableImage` saying why a file cannot be read."""
    try:
        with warnings.catch_warnings():
            # Between Pillow's warning and error limits an image is still read.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return _as_rgb(ImageOps.exif_transpose(img), path)
    except Image.DecompressionBombError:
        raise UnreadableImage(path, TOO_LARGE) from None
    except UnreadableImage:
        raise
    except OSError as err:
        if err.errno is not None:  # the system refused the file; Pillow's own OSErrors carry no errno
            raise UnreadableImage(path, NOT_OPENED) from None
        raise UnreadableImage(path, NOT_AN_IMAGE) from None
    except Exception:  # Pillow's decoders raise many types for damaged or foreign files
        raise UnreadableImage(path, NOT_AN_IMAGE) from None


def _as_rgb(img: Image.Image, path) -> Image.Image:
    if img.mode in SIXTEEN_BIT_MODES:
        # convert("RGB") would clip every value above 255 to white.
        pixels = np.asarray(img, dtype=np.float64) * (255 / 65535)
        return Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        raise UnreadableImage(path, FLOAT_PIXELS)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # converting such a palette straight to RGB warns
    try:
        return img.convert("RGB")
    except ValueError:
        raise UnreadableImage(path, f"{UNCONVERTIBLE} ({img.mode})") from None


def center_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str) -> Image.Image:
    """Resize the shorter side to ``resize_size`` then center-crop a
    ``crop_size`` square. Where the resized image would be more than
    MAX_RESIZED_SIDES times the square of ``resize_size`` (a 20000x1 strip
    resized to 288 px high: 5.8 M x 288 pixels, 5 GB), only the part the crop
    keeps is resized, straight from the original (Pillow's resize box)."""
    w, h = img.size
    scale = resize_size / min(w, h)
    new_w, new_h = max(crop_size, round(w * scale)), max(crop_size, round(h * scale))
    left, top = (new_w - crop_size) // 2, (new_h - crop_size) // 2
    if new_w * new_h <= MAX_RESIZED_SIDES * resize_size ** 2:
        img = img.resize((new_w, new_h), _PIL_FILTERS[interpolation])
        return img.crop((left, top, left + crop_size, top + crop_size))
    x_step, y_step = w / new_w, h / new_h
    box = (left * x_step, top * y_step, (left + crop_size) * x_step, (top + crop_size) * y_step)
    return img.resize((crop_size, crop_size), _PIL_FILTERS[interpolation], box=box)


def resize_and_crop(img: Image.Image, pre: Preprocessing) -> Image.Image:
    """The evaluation transform of the reference code: shorter side to
    ``pre.resize_size``, center crop ``pre.input_size``."""
    return center_crop(img, pre.resize_size, pre.input_size, pre.interpolation)


def normalise(pixels: np.ndarray, pre: Preprocessing) -> np.ndarray:
    """uint8 RGB pixels ``[..., H, W, 3]`` -> float32 model input: scaled to
    [0, 1], then ``(x - mean) / std``."""
    x = np.asarray(pixels, dtype=np.float32) / 255.0
    return (x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)


def to_model_input(img: Image.Image, pre: Preprocessing) -> np.ndarray:
    """An RGB image already at input size -> float32 [H, W, 3] model input."""
    return normalise(np.asarray(img), pre)


def read_crops(paths, resize_size: int, crop_size: int, interpolation: str):
    """For each of ``paths``, lazily and in order: its uint8
    ``[crop_size, crop_size, 3]`` pixels (:func:`center_crop`), or the
    :class:`UnreadableImage` saying why the file cannot be read."""
    for path in paths:
        try:
            img = open_rgb(path)
        except UnreadableImage as err:
            yield err
            continue
        yield np.asarray(center_crop(img, resize_size, crop_size, interpolation), np.uint8)


class ImageSet:
    """Model inputs made when they are read: ``images[i:j]`` opens and
    preprocesses those images then, as a float32 [j - i, H, W, 3] array, and
    nothing keeps them, so a stage that reads a batch at a time holds one
    batch whatever the set's size. ``items`` say which images (file paths,
    views of photos), ``read`` makes the inputs of a list of them."""

    def __init__(self, items: list, read: Callable[[list], np.ndarray]):
        self.items, self._read = list(items), read

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            return self._read(self.items[index])
        return self._read([self.items[index]])[0]

    def __iter__(self):
        for batch in batches(self, READ_BATCH):
            yield from batch

    def map(self, function: Callable[[np.ndarray], np.ndarray]) -> ImageSet:
        """These images, each batch passed through ``function`` when read."""
        return ImageSet(self.items, lambda items: function(self._read(items)))


# Images an ImageSet opens together when iterated one by one.
READ_BATCH = 8


def batches(images, size: int):
    """``images`` (an array or an :class:`ImageSet`), ``size`` at a time."""
    for start in range(0, len(images), size):
        yield images[start:start + size]


def readable_images(paths, limit: int | None = None) -> list[Path]:
    """The first ``limit`` of ``paths`` that open as images; unreadable files
    are skipped with one warning that counts them by reason."""
    paths = [Path(p) for p in paths]
    used, skipped = [], SkippedImages()
    for path in paths if limit is None or limit > 0 else []:
        try:
            open_rgb(path)
        except UnreadableImage as err:
            skipped.add(err)
            continue
        used.append(path)
        if limit is not None and len(used) >= limit:
            break  # files beyond the limit are neither read nor counted as unreadable
    if not used:
        raise EdgevitError(f"None of the {len(paths)} images could be read"
                           + (f": {skipped.summary()}." if skipped else "."))
    if skipped:
        warnings.warn(skipped.summary(), stacklevel=2)
    return used


def image_set(paths, pre: Preprocessing, limit: int | None = None) -> ImageSet:
    """The first ``limit`` readable images of ``paths`` (see
    :func:`readable_images`), each read with ``pre`` when a batch of them is."""
    def read(batch_paths: list[Path]) -> np.ndarray:
        inputs = np.empty((len(batch_paths), pre.input_size, pre.input_size, 3), np.float32)
        for row, (path, pixels) in enumerate(zip(batch_paths, read_crops(batch_paths, pre.resize_size,
                                                                         pre.input_size, pre.interpolation))):
            if isinstance(pixels, UnreadableImage):
                raise EdgevitError(f"{path} could be read before and not now ({pixels.reason}): "
                                   "was it changed or removed during the run?")
            inputs[row] = normalise(pixels, pre)
        return inputs

    return ImageSet(readable_images(paths, limit), read)


def load_images(paths, pre: Preprocessing, limit: int | None = None) -> tuple[np.ndarray, list[Path]]:
    """Up to ``limit`` readable images as one [N, H, W, 3] array (see
    :func:`image_set`), and their paths."""
    images = image_set(paths, pre, limit)
    return images[:], images.items
