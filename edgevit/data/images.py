"""Reading images into model inputs with a model's own preprocessing."""
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


def list_images(folder: str | Path) -> list[Path]:
    """Image files below ``folder`` (recursively, sorted). Files with other
    suffixes are skipped with one warning that counts them."""
    folder = Path(folder)
    if not folder.exists():
        raise EdgevitError(f"Image folder {str(folder)!r} does not exist.")
    if not folder.is_dir():
        raise EdgevitError(f"{str(folder)!r} is not a folder of images.")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
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


def resize_and_crop(img: Image.Image, pre: Preprocessing) -> Image.Image:
    """Resize the shorter side to ``pre.resize_size`` then center-crop
    ``pre.input_size`` (the evaluation transform of the reference code)."""
    w, h = img.size
    scale = pre.resize_size / min(w, h)
    new_w, new_h = max(pre.input_size, round(w * scale)), max(pre.input_size, round(h * scale))
    img = img.resize((new_w, new_h), _PIL_FILTERS[pre.interpolation])
    left, top = (new_w - pre.input_size) // 2, (new_h - pre.input_size) // 2
    return img.crop((left, top, left + pre.input_size, top + pre.input_size))


def to_model_input(img: Image.Image, pre: Preprocessing) -> np.ndarray:
    """An RGB image already at input size -> float32 [H, W, 3] model input."""
    x = np.asarray(img, dtype=np.float32) / 255.0
    return (x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)


def load_image(path: str | Path, pre: Preprocessing) -> np.ndarray:
    return to_model_input(resize_and_crop(open_rgb(path), pre), pre)


def load_images(paths, pre: Preprocessing, limit: int | None = None) -> tuple[np.ndarray, list[Path]]:
    """Load up to ``limit`` readable images as a [N, H, W, 3] batch; unreadable
    files are skipped with one warning that names the first few."""
    arrays, used, bad = [], [], []
    for path in paths:
        if limit is not None and len(arrays) >= limit:
            break
        try:
            arrays.append(load_image(path, pre))
            used.append(Path(path))
        except UnreadableImage:
            bad.append(Path(path).name)
    if bad:
        warnings.warn(f"{len(bad)} unreadable image(s) skipped: {', '.join(bad[:5])}"
                      + (" ..." if len(bad) > 5 else ""), stacklevel=2)
    if not arrays:
        raise EdgevitError("None of the images could be read.")
    return np.stack(arrays), used
