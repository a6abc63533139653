"""Which files below a folder are images: one rule for every command.

``finetune``, ``qat``, ``eval`` and ``convert --calib`` list images with
:func:`image_paths`: recursively, sorted, every entry whose name starts with
a dot left out (hidden folders such as ``.thumbs`` or
``.ipynb_checkpoints`` hold thumbnails and copies, not data), folder links
not followed (a link back up would loop), files chosen by their suffix.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from edgevit.errors import EdgevitError, not_there

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def image_paths(folder: str, others: list[str] | None = None) -> list[str]:
    """Image files below ``folder``, recursively, sorted, hidden entries left
    out, as strings (a million Path objects cost seconds and hundreds of MB).
    Symbolic links to folders are not followed; a link to a file is listed
    even when it leads nowhere, and is counted as unreadable when an image is
    read from it. Files without an image suffix are appended to ``others``
    when given, and so are the folder links left unfollowed, ending in a
    separator (``ls -F``'s mark of a folder)."""
    found, pending = [], [folder]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:  # a folder removed or closed to us meanwhile: its images are not there to read
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
            elif _is_folder_link(entry):
                if others is not None:
                    others.append(entry.path + os.sep)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                found.append(entry.path)
            elif others is not None:
                others.append(entry.path)
    found.sort()
    return found


def _is_folder_link(entry: os.DirEntry) -> bool:
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


def list_images(folder: str | Path) -> list[Path]:
    """The images of ``folder`` (:func:`image_paths`) as paths; files with
    other suffixes are skipped with one warning that counts them; an error
    when the folder is missing or holds no image."""
    folder = Path(folder)
    if not folder.exists():
        raise EdgevitError(f"Image folder {str(folder)!r} {not_there(folder)}.")
    if not folder.is_dir():
        raise EdgevitError(f"{str(folder)!r} is not a folder of images.")
    others: list[str] = []
    images = [Path(p) for p in image_paths(str(folder), others)]
    links = sum(other.endswith(os.sep) for other in others)
    if len(others) > links:
        warnings.warn(f"{len(others) - links} non-image file(s) in {folder} skipped", stacklevel=2)
    if links:
        warnings.warn(f"{links} folder link(s) in {folder} not followed", stacklevel=2)
    if not images:
        raise EdgevitError(f"Image folder {str(folder)!r} contains no images "
                           f"(looked for {', '.join(sorted(IMAGE_SUFFIXES))}).")
    return images


def left_out_summary(left_out: list[str]) -> str:
    """Files without an image suffix, and folder links (ending in a
    separator), where images were expected, in words."""
    files = [path for path in left_out if not path.endswith(os.sep)]
    links = [path for path in left_out if path.endswith(os.sep)]
    parts = []
    if files:
        parts.append(f"{len(files)} file(s) without an image suffix ({', '.join(sorted(IMAGE_SUFFIXES))}) left "
                     f"out: {_first(files)}")
    if links:
        parts.append(f"{len(links)} folder link(s) not followed (a link may loop back up; copy or move the images "
                     f"into the class folder instead): {_first(links)}")
    return "; ".join(parts)


def _first(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (" ..." if len(paths) > 3 else "")
