"""The files packed in a model: the zip archive appended to its flatbuffer,
which holds the files the standard metadata names (the labels), read within
bounds.

A zip member costs what it declares, and a hostile file declares what it
likes: 2 MB of deflated zeros inflate to 2 GiB. So only the members asked
for are read; each is refused by name when it declares more than
MAX_PACKED_FILE_BYTES, or more than deflate can make of the bytes it
occupies, and it is read no further than it declares. A member zipfile
would fail on half-way (encrypted, compressed by an unknown method, a CRC
that does not match) is refused with what is wrong with it, and so is a
name packed twice (zip readers differ in which one they take)."""
from __future__ import annotations

import io
import zipfile
import zlib

from edgevit.errors import EdgevitError

# The largest packed file read: the labels of ImageNet-21k's 21,841 classes
# take about 0.3 MB.
MAX_PACKED_FILE_BYTES = 16 << 20
# Deflate makes at most 1032 bytes of each byte it stores (a 258-byte match
# in a code of 2 bits).
MAX_DEFLATE_RATIO = 1032
READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
ENCRYPTED_FLAG = 0x1


def packed_names(content: bytes) -> list[str]:
    """The names of the zip's members, in order, a repeated name as often as
    it is packed; empty when ``content`` has no readable zip appended."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            return [info.filename for info in archive.infolist()]
    except (zipfile.BadZipFile, OSError, ValueError):
        return []


def packed_files(content: bytes, names: list[str] | None = None) -> dict[str, bytes]:
    """The members ``names`` (every member when None) of the zip appended to
    ``content`` that it holds, by name; empty without a zip. A member that
    cannot be read honestly raises EdgevitError naming it."""
    if not zipfile.is_zipfile(io.BytesIO(content)):
        return {}
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            infos = archive.infolist()
            wanted = [info.filename for info in infos] if names is None else list(names)
            found = {}
            for name in dict.fromkeys(wanted):
                members = [info for info in infos if info.filename == name]
                if len(members) > 1:
                    raise EdgevitError(f"The zip packed in the model holds {len(members)} files named {name}; zip "
                                       "readers differ in which one they take.")
                if members:
                    found[name] = _read_member(archive, members[0], len(content))
            return found
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError, NotImplementedError) as err:
        raise EdgevitError(f"The zip packed in the model is damaged ({err}).") from None


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> bytes:
    name = info.filename
    if info.flag_bits & ENCRYPTED_FLAG:
        raise EdgevitError(f"The model's packed file {name} is encrypted, which no metadata reader decrypts.")
    if info.compress_type not in READABLE_METHODS:
        raise EdgevitError(f"The model's packed file {name} is compressed with method {info.compress_type}; "
                           "packed files are stored or deflated.")
    if info.file_size > MAX_PACKED_FILE_BYTES:
        raise EdgevitError(f"The model's packed file {name} declares {info.file_size:,} bytes, beyond the "
                           f"{MAX_PACKED_FILE_BYTES:,} a packed file may take.")
    most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
        MAX_DEFLATE_RATIO * info.compress_size + 64
    if info.compress_size > size or info.file_size > most:
        raise EdgevitError(f"The model's packed file {name} declares {info.file_size:,} bytes from "
                           f"{info.compress_size:,} stored, which its {size:,}-byte model cannot hold.")
    try:
        with archive.open(info) as member:
            return member.read(info.file_size)
    except zipfile.BadZipFile as err:
        if "CRC" in str(err):
            raise EdgevitError(f"The model's packed file {name} fails its CRC check: its bytes were changed after "
                               "it was packed.") from None
        raise
