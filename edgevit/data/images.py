"""Reading images into model inputs with a model's own preprocessing.

edgevit's one image path: opening files (:func:`open_rgb`), the evaluation
resize and center crop (:func:`center_crop`) and the normalisation
(:func:`normalise`) serve the export calibration and validation sets, the
sample photos and the training data (``edgevit.train.data`` adds only its
training augmentation).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from edgevit.errors import EdgevitError
from edgevit.registry import Preprocessing

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}

_PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}


class UnreadableImage(Exception):
    pass


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
        raise EdgevitError(f"Image folder {str(folder)!r} does not exist.")
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
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise UnreadableImage(f"{path}: {err}") from err


def center_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str) -> Image.Image:
    """Resize the shorter side to ``resize_size`` then center-crop a
    ``crop_size`` square."""
    w, h = img.size
    scale = resize_size / min(w, h)
    new_w, new_h = max(crop_size, round(w * scale)), max(crop_size, round(h * scale))
    img = img.resize((new_w, new_h), _PIL_FILTERS[interpolation])
    left, top = (new_w - crop_size) // 2, (new_h - crop_size) // 2
    return img.crop((left, top, left + crop_size, top + crop_size))


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
    ``[crop_size, crop_size, 3]`` pixels (:func:`center_crop`), or None when
    the file cannot be read."""
    for path in paths:
        try:
            img = open_rgb(path)
        except UnreadableImage:
            yield None
            continue
        yield np.asarray(center_crop(img, resize_size, crop_size, interpolation), np.uint8)


def load_images(paths, pre: Preprocessing, limit: int | None = None) -> tuple[np.ndarray, list[Path]]:
    """Load up to ``limit`` readable images as a [N, H, W, 3] batch; unreadable
    files are skipped with one warning that names the first few."""
    paths = [Path(p) for p in paths]
    arrays, used, bad = [], [], []
    if limit is None or limit > 0:
        for path, pixels in zip(paths, read_crops(paths, pre.resize_size, pre.input_size, pre.interpolation)):
            if pixels is None:
                bad.append(path.name)
                continue
            arrays.append(normalise(pixels, pre))
            used.append(path)
            if limit is not None and len(arrays) >= limit:
                break  # files beyond the limit are neither read nor counted as unreadable
    if bad:
        warnings.warn(f"{len(bad)} unreadable image(s) skipped: {', '.join(bad[:5])}"
                      + (" ..." if len(bad) > 5 else ""), stacklevel=2)
    if not arrays:
        raise EdgevitError("None of the images could be read.")
    return np.stack(arrays), used
