"""The standard TFLite metadata (the ``TFLITE_METADATA`` entry) that app
developers' clients read: MediaPipe Tasks' ``ImageClassifier``, the TFLite
Task Library and Android Studio's ML Model Binding.

The entry is a ``ModelMetadata`` flatbuffer (file identifier ``M001``) in a
model buffer; files it names (the labels) travel in a zip archive appended
to the model, stored uncompressed, which flatbuffer readers ignore.

Written here with the ``flatbuffers`` library and a table of the schema's
fields in slot order (tflite-support's metadata_schema.fbs, the subset an
image classifier uses). The maintained writers were measured unusable as a
dependency: tflite-support pins protobuf < 4 (TensorFlow 2.21 needs newer),
and MediaPipe's schema bindings import only with all of MediaPipe (4.3 s,
opencv-contrib-python, which breaks an installed opencv-python). The tests
read every file back with MediaPipe's bindings and load it in both clients.
"""
from __future__ import annotations

import io
import zipfile

import flatbuffers
from flatbuffers import number_types
from flatbuffers.table import Table

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import metadata_name, read_model, with_metadata
from edgevit.litert.metadata import TAKES_RGB_BYTES, TAKES_RGB_UNIT

METADATA_NAME = "TFLITE_METADATA"
FILE_IDENTIFIER = b"M001"
# The oldest metadata parser that reads every field written here.
MIN_PARSER_VERSION = "1.0.0"
LABELS_FILE = "labels.txt"

COLOR_RGB = 1
LABELS_TYPE_AXIS = 2       # AssociatedFileType.TENSOR_AXIS_LABELS
CONTENT_FEATURE, CONTENT_IMAGE = 1, 2   # ContentProperties union members
UNIT_NORMALIZATION = 1                   # ProcessUnitOptions union member

# Each table's fields in slot order; a union takes two slots (its type byte,
# then the value), written here as ("<name>_type", "utype") + ("<name>", "union").
SCHEMA: dict[str, list[tuple[str, str]]] = {
    "ModelMetadata": [("name", "string"), ("description", "string"), ("version", "string"),
                      ("subgraph_metadata", "[SubGraphMetadata]"), ("author", "string"), ("license", "string"),
                      ("associated_files", "[AssociatedFile]"), ("min_parser_version", "string")],
    "SubGraphMetadata": [("name", "string"), ("description", "string"),
                         ("input_tensor_metadata", "[TensorMetadata]"),
                         ("output_tensor_metadata", "[TensorMetadata]"),
                         ("associated_files", "[AssociatedFile]")],
    "TensorMetadata": [("name", "string"), ("description", "string"), ("dimension_names", "[string]"),
                       ("content", "Content"), ("process_units", "[ProcessUnit]"), ("stats", "Stats"),
                       ("associated_files", "[AssociatedFile]")],
    "Content": [("content_properties_type", "utype"), ("content_properties", "union"), ("range", "ValueRange")],
    "ImageProperties": [("color_space", "byte"), ("default_size", "ImageSize")],
    "ImageSize": [("width", "uint"), ("height", "uint")],
    "FeatureProperties": [],
    "ValueRange": [("min", "int"), ("max", "int")],
    "ProcessUnit": [("options_type", "utype"), ("options", "union")],
    "NormalizationOptions": [("mean", "[float]"), ("std", "[float]")],
    "Stats": [("max", "[float]"), ("min", "[float]")],
    "AssociatedFile": [("name", "string"), ("description", "string"), ("type", "byte"), ("locale", "string"),
                       ("version", "string")],
}
UNIONS = {"content_properties": {CONTENT_FEATURE: "FeatureProperties", CONTENT_IMAGE: "ImageProperties"},
          "options": {UNIT_NORMALIZATION: "NormalizationOptions"}}
_SCALARS = {"byte": (number_types.Int8Flags, "PrependInt8Slot"),
            "utype": (number_types.Uint8Flags, "PrependUint8Slot"),
            "uint": (number_types.Uint32Flags, "PrependUint32Slot"),
            "int": (number_types.Int32Flags, "PrependInt32Slot")}


def standard_metadata(doc: dict) -> dict:
    """The ModelMetadata of an image classifier, as a dict of the schema's
    fields, built from edgevit's metadata document ``doc``
    (:func:`edgevit.litert.metadata.build_metadata`), so the two entries
    cannot say different things."""
    pre, inp, out = doc["preprocessing"], doc["input"], doc["output"]
    inside = (f"the file normalises them itself (mean {_listed(pre['mean'])}, std {_listed(pre['std'])} of "
              "[0, 1] pixels)")
    if inp.get("takes") == TAKES_RGB_BYTES:  # a client passes the bytes as they are
        mean, std, low, high = [0.0], [1.0], [0.0], [255.0]
        input_text = f"RGB image, the camera's bytes (0-255); {inside}."
    elif inp.get("takes") == TAKES_RGB_UNIT:  # one mean and std: MediaPipe refuses per-channel ones
        mean, std, low, high = [0.0], [255.0], [0.0], [1.0]
        input_text = f"RGB image, pixels / 255 (0-1); {inside}."
    else:
        mean, std = [255.0 * m for m in pre["mean"]], [255.0 * s for s in pre["std"]]
        low = _one_if_equal([(0.0 - m) / s for m, s in zip(mean, std)])
        high = _one_if_equal([(255.0 - m) / s for m, s in zip(mean, std)])
        mean, std = _one_if_equal(mean), _one_if_equal(std)
        input_text = (f"RGB image, each pixel normalised as (pixel - mean) / std with mean {_listed(mean)} "
                      f"and std {_listed(std)} (pixels 0-255).")
    size = int(pre["input_size"])
    probabilities = out.get("kind") == "probabilities"
    labels_file = {"name": LABELS_FILE, "type": LABELS_TYPE_AXIS,
                   "description": f"The {doc['num_classes']} class names, one a line, in output order."}
    return {
        "name": doc["model"],
        "description": (f"{doc['model']} ({doc['family']}) image classifier, {doc['precision']}, "
                        f"{doc['num_classes']} classes, {size}x{size} input; resize the shorter side to "
                        f"{pre['resize_size']} ({pre['interpolation']}) and crop the centre. "
                        f"Weights: {doc['weights']}."),
        "version": f"edgevit {doc['edgevit_version']}",
        "author": "edgevit",
        "license": doc.get("licence") or "",
        "min_parser_version": MIN_PARSER_VERSION,
        "subgraph_metadata": [{
            "input_tensor_metadata": [{
                "name": "image",
                "description": input_text,
                "content": {"content_properties": (CONTENT_IMAGE, {
                    "color_space": COLOR_RGB, "default_size": {"width": size, "height": size}})},
                "process_units": [{"options": (UNIT_NORMALIZATION, {"mean": mean, "std": std})}],
                "stats": {"max": high, "min": low},
            }],
            "output_tensor_metadata": [{
                "name": "probability" if probabilities else "logits",
                "description": ("Probability of each class (softmax)." if probabilities else
                                "Logit of each class (no softmax: apply one for probabilities)."),
                "content": {"content_properties": (CONTENT_FEATURE, {})},
                **({"stats": {"max": [1.0], "min": [0.0]}} if probabilities else {}),
                "associated_files": [labels_file],
            }],
        }],
    }


def _one_if_equal(values: list[float]) -> list[float]:
    """One value where every channel has the same (MediaPipe Tasks applies a
    single mean and std only)."""
    return values[:1] if len(set(values)) == 1 else values


def _listed(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def populate(content: bytes, metadata: dict, files: dict[str, bytes]) -> bytes:
    """``content`` with ``metadata`` (a ModelMetadata dict) under
    TFLITE_METADATA and ``files`` (name -> bytes) in a zip appended to it;
    an earlier standard entry and zip are replaced."""
    return with_files(with_metadata(content, METADATA_NAME, serialize(metadata)), files)


def with_files(flatbuffer: bytes, files: dict[str, bytes]) -> bytes:
    """``flatbuffer`` (a model without a zip) with ``files`` in a zip appended
    to it, stored uncompressed, its offsets counted from the start of the
    whole file (where the clients' zip readers look)."""
    if not files:
        return flatbuffer
    whole = io.BytesIO(flatbuffer)
    with zipfile.ZipFile(whole, "a", compression=zipfile.ZIP_STORED) as zf:
        for name, payload in files.items():
            zf.writestr(name, payload)
    return whole.getvalue()


def serialize(metadata: dict) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(_build(builder, "ModelMetadata", metadata), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def _build(b: flatbuffers.Builder, table: str, obj: dict) -> int:
    fields = SCHEMA[table]
    offsets: dict[int, int] = {}
    for slot, (name, kind) in enumerate(fields):
        value = obj.get(name)
        if value is None or kind in _SCALARS:
            continue
        if kind == "string":
            offsets[slot] = b.CreateString(value)
        elif kind == "union":
            member, fields_of = value
            offsets[slot] = _build(b, UNIONS[name][member], fields_of)
        elif kind.startswith("["):
            offsets[slot] = _vector(b, kind[1:-1], value)
        else:
            offsets[slot] = _build(b, kind, value)
    b.StartObject(len(fields))
    for slot, (name, kind) in enumerate(fields):
        if slot in offsets:
            b.PrependUOffsetTRelativeSlot(slot, offsets[slot], 0)
        elif kind == "utype" and fields[slot + 1][0] in obj:
            b.PrependUint8Slot(slot, obj[fields[slot + 1][0]][0], 0)
        elif kind in _SCALARS and obj.get(name) is not None:
            getattr(b, _SCALARS[kind][1])(slot, obj[name], 0)
    return b.EndObject()


def _vector(b: flatbuffers.Builder, element: str, values: list) -> int:
    if element == "float":
        b.StartVector(4, len(values), 4)
        for v in reversed(values):
            b.PrependFloat32(float(v))
        return b.EndVector()
    children = [b.CreateString(v) if element == "string" else _build(b, element, v) for v in values]
    b.StartVector(4, len(children), 4)
    for child in reversed(children):
        b.PrependUOffsetTRelative(child)
    return b.EndVector()


def read_standard(content: bytes) -> dict | None:
    """The TFLITE_METADATA entry as a dict of the schema's fields (unions as
    (member, fields)), with ``files``: the appended zip's members by name;
    None when the file has no such entry."""
    model = read_model(content)
    entry = next((e for e in model.metadata or [] if metadata_name(e) == METADATA_NAME), None)
    if entry is None:
        return None
    try:
        data = bytes(model.buffers[entry.buffer].data)
        if data[4:8] != FILE_IDENTIFIER:
            raise ValueError("no M001 file identifier")
        root = number_types.UOffsetTFlags.py_type(flatbuffers.encode.Get(number_types.UOffsetTFlags.packer_type,
                                                                          data, 0))
        parsed = _read(data, root, "ModelMetadata")
    except (IndexError, TypeError, ValueError, KeyError, UnicodeDecodeError) as err:
        raise EdgevitError(f"The {METADATA_NAME} entry is not a readable ModelMetadata flatbuffer ({err}).") \
            from None
    parsed["files"] = associated_files(content)
    return parsed


def associated_files(content: bytes) -> dict[str, bytes]:
    """The members of the zip appended to a model (empty without one)."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as zf:
            return {name: zf.read(name) for name in zf.namelist()}
    except (zipfile.BadZipFile, OSError, ValueError):
        return {}


def _read(buf: bytes, pos: int, table: str) -> dict:
    t = Table(bytearray(buf), pos)
    out: dict = {}
    fields = SCHEMA[table]
    for slot, (name, kind) in enumerate(fields):
        o = t.Offset(4 + 2 * slot)
        if o == 0 or kind == "utype":
            continue
        at = o + t.Pos
        if kind in _SCALARS:
            out[name] = t.Get(_SCALARS[kind][0], at)
        elif kind == "string":
            out[name] = t.String(at).decode("utf-8")
        elif kind == "union":
            type_offset = t.Offset(4 + 2 * (slot - 1))
            member = t.Get(number_types.Uint8Flags, type_offset + t.Pos) if type_offset else 0
            value = Table(t.Bytes, 0)
            t.Union(value, o)
            out[name] = (member, _read(buf, value.Pos, UNIONS[name][member]) if member in UNIONS[name] else {})
        elif kind.startswith("["):
            element, start, count = kind[1:-1], t.Vector(o), t.VectorLen(o)
            if element == "float":
                out[name] = [t.Get(number_types.Float32Flags, start + 4 * i) for i in range(count)]
            elif element == "string":
                out[name] = [t.String(start + 4 * i).decode("utf-8") for i in range(count)]
            else:
                out[name] = [_read(buf, t.Indirect(start + 4 * i), element) for i in range(count)]
        else:
            out[name] = _read(buf, t.Indirect(at), kind)
    return out
