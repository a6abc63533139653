"""Opening image files as 8-bit RGB, and the tally of files that cannot be.

Every reader of images (training and evaluation streams, calibration and
validation sets, sample photos) opens files through :func:`open_rgb`, so a
file is readable, upright and in colour the same way everywhere. A file that
cannot be read raises :class:`UnreadableImage` with one of the reasons below;
callers skip it and count it in an :class:`UnreadableTally`, never a
traceback.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

# Why an image file was skipped, in a few words (skipped files are counted by these).
NOT_AN_IMAGE = "not an image, or damaged"
NOT_OPENED = "could not be opened (removed, no permission, or a link that leads nowhere)"
TOO_LARGE = "more pixels than Pillow's decompression-bomb limit"
# A whole image that decoding could not fit in memory (a shell's `ulimit -v`, or a host short of memory).
OUT_OF_MEMORY = "too large to decode in the memory this process may use (`ulimit -v`, or free memory)"
FLOAT_PIXELS = "floating-point pixels (no 8-bit scale)"
UNCONVERTIBLE = "a colour mode with no RGB conversion"
# Pillow's modes for 16-bit grayscale (PNG, TIFF; "I" holds it in 32 bits).
SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


class UnreadableImage(Exception):
    """An image file that is skipped, with the reason (one of the constants above)."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


class UnreadableTally:
    """The files left out of an image set because they could not be read, by
    reason, each counted once however often it is met; safe to add to from an
    input pipeline's threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.by_reason: dict[str, list[Path]] = {}
        self._seen: set[str] = set()

    def add(self, err: UnreadableImage) -> None:
        with self._lock:
            if str(err.path) not in self._seen:
                self._seen.add(str(err.path))
                self.by_reason.setdefault(err.reason, []).append(err.path)

    def __len__(self) -> int:
        return len(self._seen)

    def counts(self) -> dict[str, int]:
        return {reason: len(paths) for reason, paths in self.by_reason.items()}

    def summary(self) -> str:
        """E.g. ``3 unreadable image(s) skipped: 2 not an image, or damaged (a.jpg, b.jpg); 1 ...``."""
        parts = []
        for reason, paths in self.by_reason.items():
            names = ", ".join(p.name for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
            parts.append(f"{len(paths)} {reason} ({names})")
        return f"{len(self)} unreadable image(s) skipped: " + "; ".join(parts)


def open_rgb(path: str | Path, draft_size: tuple[int, int] | None = None) -> Image.Image:
    """An image file as 8-bit RGB, upright, as the Android demo sees it: EXIF
    orientation applied, 16-bit grayscale scaled to 8 bits, palette, CMYK and
    grayscale converted, alpha dropped (the app ignores it too). Raises
    :class:`UnreadableImage` saying why a file cannot be read.

    ``draft_size``: a JPEG may be decoded at 1/2, 1/4 or 1/8 scale while it
    stays at least this size (libjpeg's scaled decoding: a 4000x3000 photo
    cropped to 256 px decodes at 500x375, 30 times less work); other formats
    ignore it."""
    with reading(path), Image.open(path) as img:
        if draft_size is not None and img.format == "JPEG":
            img.draft(None, draft_size)
        return _as_rgb(ImageOps.exif_transpose(img), path)


@contextmanager
def reading(path: str | Path):
    """While ``path`` is opened and decoded: the system's and Pillow's
    errors raised as :class:`UnreadableImage`, with their reason."""
    try:
        with warnings.catch_warnings():
            # Between Pillow's warning and error limits an image is still read.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            yield
    except Image.DecompressionBombError:
        raise UnreadableImage(path, TOO_LARGE) from None
    except MemoryError:  # Pillow's allocation of the decoded pixels failed: the file may be a valid image
        raise UnreadableImage(path, OUT_OF_MEMORY) from None
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
