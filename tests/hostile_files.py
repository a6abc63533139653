"""Hostile .tflite files, built small inside the tests: metadata that
references far more than it holds, zips that inflate far beyond their size
or that zipfile cannot read, and metadata entries that lie or repeat."""
from __future__ import annotations

import functools
import json
import struct
import zipfile
import zlib

import flatbuffers
import numpy as np

from edgevit.litert.flatbuffer import metadata_entry, read_model, schema_module, with_metadata, write_model
from edgevit.litert.metadata import METADATA_NAME as EDGEVIT_ENTRY
from edgevit.litert.standard_metadata import FILE_IDENTIFIER, LABELS_FILE
from edgevit.litert.standard_metadata import METADATA_NAME as STANDARD_ENTRY


def flatbuffer_of(content: bytes) -> bytes:
    """A model's flatbuffer, without the zip appended to it."""
    return write_model(read_model(content), len(content))


def with_zip(flatbuffer: bytes, members: list[tuple[str, bytes]]) -> bytes:
    """``flatbuffer`` with a zip of ``members`` (stored) appended, as
    edgevit appends its labels; a name may repeat."""
    import io
    import warnings

    whole = io.BytesIO(flatbuffer)
    with warnings.catch_warnings(), zipfile.ZipFile(whole, "a") as archive:
        warnings.simplefilter("ignore")  # "Duplicate name"
        for name, data in members:
            archive.writestr(name, data)
    return whole.getvalue()


def labels_member(content: bytes) -> bytes:
    """The labels file packed in an edgevit model."""
    import io

    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        return archive.read(LABELS_FILE)


def _shared_vector(b: flatbuffers.Builder, table: int, n: int) -> int:
    """A vector of ``n`` offsets that all point at one ``table``."""
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependUOffsetTRelative(table)
    return b.EndVector()


def shared_table_metadata(n: int) -> bytes:
    """A ModelMetadata flatbuffer in which each of ``n`` subgraphs is one
    shared table, whose ``n`` input tensors are one shared table, whose
    ``n`` process units are one shared table, whose mean is ``n`` floats:
    a "billion laughs" of about 12 n bytes that reads as n^4 values."""
    b = flatbuffers.Builder(1024)

    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependFloat32(0.5)
    mean = b.EndVector()
    b.StartObject(2)  # NormalizationOptions: mean, std
    b.PrependUOffsetTRelativeSlot(0, mean, 0)
    normalization = b.EndObject()
    b.StartObject(2)  # ProcessUnit: options_type, options
    b.PrependUOffsetTRelativeSlot(1, normalization, 0)
    b.PrependUint8Slot(0, 1, 0)
    units = _shared_vector(b, b.EndObject(), n)
    b.StartObject(7)  # TensorMetadata: process_units is slot 4
    b.PrependUOffsetTRelativeSlot(4, units, 0)
    tensors = _shared_vector(b, b.EndObject(), n)
    b.StartObject(5)  # SubGraphMetadata: input_tensor_metadata is slot 2
    b.PrependUOffsetTRelativeSlot(2, tensors, 0)
    subgraphs = _shared_vector(b, b.EndObject(), n)
    b.StartObject(8)  # ModelMetadata: subgraph_metadata is slot 3
    b.PrependUOffsetTRelativeSlot(3, subgraphs, 0)
    b.Finish(b.EndObject(), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def shared_subgraph_model(n: int) -> bytes:
    """A .tflite flatbuffer whose ``n`` subgraphs are one shared subgraph of
    ``n`` shared tensors: about 8 n bytes that unpack to n^2 tensors."""
    schema = schema_module()
    b = flatbuffers.Builder(1024)

    name = b.CreateString("t")
    schema.TensorStart(b)
    schema.TensorAddName(b, name)
    tensors = _shared_vector(b, schema.TensorEnd(b), n)
    schema.SubGraphStart(b)
    schema.SubGraphAddTensors(b, tensors)
    subgraphs = _shared_vector(b, schema.SubGraphEnd(b), n)
    schema.ModelStart(b)
    schema.ModelAddVersion(b, 3)
    schema.ModelAddSubgraphs(b, subgraphs)
    b.Finish(schema.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def with_entry(content: bytes, name: str, data: bytes) -> bytes:
    """``content`` with its metadata entry ``name`` holding ``data``, its zip kept."""
    import io

    members = []
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    except zipfile.BadZipFile:
        pass
    flatbuffer = with_metadata(flatbuffer_of(content), name, data)
    return with_zip(flatbuffer, members) if members else flatbuffer


def entry_data(content: bytes, name: str) -> bytes:
    return metadata_entry(content, name)


def with_second_entry(content: bytes, name: str, data: bytes) -> bytes:
    """``content`` with another metadata entry named ``name`` after the
    first, its zip kept."""
    import io

    schema = schema_module()
    model = read_model(content)
    model.buffers.append(schema.BufferT())
    model.buffers[-1].data = np.frombuffer(data, np.uint8)
    entry = schema.MetadataT()
    entry.name, entry.buffer = name, len(model.buffers) - 1
    model.metadata.append(entry)
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    return with_zip(write_model(model, len(content) + len(data)), members)


def with_edgevit_fields(content: bytes, edit) -> bytes:
    """``content`` with its edgevit metadata document edited by ``edit(doc)``."""
    document = json.loads(entry_data(content, EDGEVIT_ENTRY))
    edit(document)
    return with_entry(content, EDGEVIT_ENTRY, json.dumps(document).encode())


def with_standard_data(content: bytes, data: bytes) -> bytes:
    return with_entry(content, STANDARD_ENTRY, data)


def standard_data(content: bytes) -> bytes:
    return entry_data(content, STANDARD_ENTRY)


def with_inflating_member(content: bytes, name: str, mib: int) -> bytes:
    """``content``'s flatbuffer and labels, then a deflated member ``name``
    that inflates to ``mib`` MiB of zeros: a few KB per GiB. Every MiB of
    zeros deflates to the same block, so the stream is that block repeated,
    never the zeros themselves."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    members = [(LABELS_FILE, labels_member(content))] if name != LABELS_FILE else []
    packed = with_zip(flatbuffer_of(content), [*members, (name, block * mib + compressor.flush())])
    return with_member_patched(packed, name, method=zipfile.ZIP_DEFLATED, crc=zeros_crc(mib), size=mib << 20)


@functools.cache
def zeros_crc(mib: int) -> int:
    """The CRC-32 of ``mib`` MiB of zeros (a second per GiB: computed once)."""
    zeros, crc = bytes(1 << 20), 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    return crc


def with_member_patched(content: bytes, name: str, *, flags: int | None = None, method: int | None = None,
                        crc: int | None = None, size: int | None = None) -> bytes:
    """``content`` with member ``name``'s general-purpose flags (0x1:
    encrypted), compression method, CRC or uncompressed size rewritten in
    both its local and central headers."""
    data = bytearray(content)
    for signature, flag_at, method_at, crc_at, name_at in ((b"PK\x03\x04", 6, 8, 14, 30),
                                                           (b"PK\x01\x02", 8, 10, 16, 46)):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            length = struct.unpack_from("<H", data, start + (26 if signature == b"PK\x03\x04" else 28))[0]
            if bytes(data[start + name_at:start + name_at + length]) == name.encode():
                if flags is not None:
                    struct.pack_into("<H", data, start + flag_at, flags)
                if method is not None:
                    struct.pack_into("<H", data, start + method_at, method)
                if crc is not None:
                    struct.pack_into("<I", data, start + crc_at, crc)
                if size is not None:  # after the CRC and the compressed size
                    struct.pack_into("<I", data, start + crc_at + 8, size)
            start += 4
    return bytes(data)
