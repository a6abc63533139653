"""What a JPEG file's header says, read without decoding it: its size, its
colour components and its EXIF orientation.

The training stream reads this for every image of every batch to choose
its decoder (:func:`edgevit.data.transforms.tensorflow_box`), in Python,
under the interpreter's lock: Pillow's ``Image.open`` took 0.3 ms an image
(an eighth of the image's whole decode and crop), reading the markers up to
the first scan here takes a few tens of microseconds.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

# Bytes read from the start of a file: the markers before the first scan
# (an EXIF block is at most 64 KiB, and comes first).
HEADER_BYTES = 1 << 17
# Start-of-frame markers of the baseline, extended and progressive Huffman-coded JPEGs libjpeg decodes.
FRAME_MARKERS = {0xC0, 0xC1, 0xC2}
EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    components: int       # 1: grayscale, 3: YCbCr (RGB), 4: CMYK or YCCK
    orientation: int      # EXIF orientation: 1 when there is none, 0 when the block cannot be read
    whole: bool           # ends in its end-of-image marker (a truncated file does not)


def read_jpeg_header(path: str) -> JpegHeader | None:
    """The header of the JPEG at ``path``; None when it is not a JPEG this
    reader understands (another format, arithmetic coding, a damaged or
    missing header): the caller then reads it the general way."""
    try:
        with open(path, "rb") as file:
            head = file.read(HEADER_BYTES)
            file.seek(-2, 2)
            whole = file.read(2) == b"\xff\xd9"
    except OSError:
        return None
    if not head.startswith(b"\xff\xd8"):
        return None
    orientation, position = 1, 2
    while position + 4 <= len(head):
        if head[position] != 0xFF:
            return None
        marker = head[position + 1]
        if marker == 0xFF:  # fill bytes before a marker
            position += 1
            continue
        (length,) = struct.unpack_from(">H", head, position + 2)
        segment = head[position + 4:position + 2 + length]
        if marker == 0xE1 and segment.startswith(b"Exif\x00\x00"):
            orientation = _orientation(segment[6:])
        elif marker in FRAME_MARKERS and len(segment) >= 6:
            height, width = struct.unpack_from(">HH", segment, 1)
            return JpegHeader(width, height, segment[5], orientation, whole) if width and height else None
        elif 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) or marker == 0xDA:
            return None  # lossless or arithmetic-coded frames, or a scan before any frame
        position += 2 + length
    return None


def _orientation(tiff: bytes) -> int:
    """The orientation tag of an EXIF block's first image directory (1 when
    absent, 0 when the block cannot be read)."""
    if tiff[:4] not in (b"II*\x00", b"MM\x00*"):
        return 0
    order = "<" if tiff[:2] == b"II" else ">"
    try:
        (first,) = struct.unpack_from(order + "I", tiff, 4)
        (entries,) = struct.unpack_from(order + "H", tiff, first)
        for entry in range(entries):
            tag, kind, count = struct.unpack_from(order + "HHI", tiff, first + 2 + 12 * entry)
            if tag == EXIF_ORIENTATION and kind == 3 and count == 1:
                return struct.unpack_from(order + "H", tiff, first + 2 + 12 * entry + 8)[0]
    except struct.error:
        return 0
    return 1
