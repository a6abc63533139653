"""The standard TFLite metadata (the ``TFLITE_METADATA`` entry) that app
developers' clients read: MediaPipe Tasks' ``ImageClassifier``, the TFLite
Task Library and Android Studio's ML Model Binding.

The entry is a ``ModelMetadata`` flatbuffer (file identifier ``M001``) in a
model buffer; files it names (the labels) travel in a zip archive appended
to the model, stored uncompressed, which flatbuffer readers ignore. Both are
read within bounds: the flatbuffer by a reader that checks every offset and
counts what it visits, the zip by ``edgevit.litert.packed_files``.

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
import struct
import zipfile

import flatbuffers
import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import MAX_REFERENCED_PER_BYTE, metadata_entry, with_metadata
from edgevit.litert.metadata import DETECTION, SEGMENTATION, TAKES_RGB_BYTES, TAKES_RGB_UNIT, task_of
from edgevit.litert.packed_files import packed_files

METADATA_NAME = "TFLITE_METADATA"
FILE_IDENTIFIER = b"M001"
# The oldest metadata parser that reads every field written here (a
# segmenter's: SubGraphMetadata.custom_metadata came with schema 1.5.0).
MIN_PARSER_VERSION, MIN_PARSER_VERSION_CUSTOM = "1.0.0", "1.5.0"
LABELS_FILE = "labels.txt"
# MediaPipe's ImageSegmenter reads its activation from the subgraph's custom
# metadata of this name, an ImageSegmenterOptions flatbuffer (identifier
# V001, schema 1.0.0); without it, it warns and takes NONE.
SEGMENTER_METADATA, SEGMENTER_IDENTIFIER, SEGMENTER_PARSER_VERSION = "SEGMENTER_METADATA", b"V001", "1.0.0"
ACTIVATION_NONE, ACTIVATION_SIGMOID, ACTIVATION_SOFTMAX = 0, 1, 2
# the name of a segmenter's output tensor (as tflite-support's segmenter writer names it)
SEGMENTATION_OUTPUT = "segmentation_masks"

# MediaPipe's ObjectDetector reads a raw detector's anchors and box decoding
# from the subgraph's custom metadata of this name, an ObjectDetectorOptions
# flatbuffer (identifier V001, schema 1.0.0), as Model Maker writes it.
DETECTOR_METADATA, DETECTOR_IDENTIFIER, DETECTOR_PARSER_VERSION = "DETECTOR_METADATA", b"V001", "1.0.0"
# a detector file's two forms (edgevit's document says which: detection.form)
RAW_FORM, NMS_FORM = "raw", "nms"
# BoundingBoxProperties: the (left, top, right, bottom) places of a box's
# values (y first), its type BOUNDARIES and coordinates RATIO (normalised)
BOX_INDEX, BOUNDARIES, RATIO = (1, 0, 3, 2), 1, 0

COLOR_RGB, COLOR_GRAYSCALE = 1, 2
LABELS_TYPE_AXIS = 2       # AssociatedFileType.TENSOR_AXIS_LABELS
LABELS_TYPE_VALUE = 3      # AssociatedFileType.TENSOR_VALUE_LABELS
CONTENT_FEATURE, CONTENT_IMAGE, CONTENT_BOUNDING_BOX = 1, 2, 3   # ContentProperties union members
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
                         ("associated_files", "[AssociatedFile]"), ("input_process_units", "[ProcessUnit]"),
                         ("output_process_units", "[ProcessUnit]"), ("input_tensor_groups", "[TensorGroup]"),
                         ("output_tensor_groups", "[TensorGroup]"), ("custom_metadata", "[CustomMetadata]")],
    "TensorGroup": [("name", "string"), ("tensor_names", "[string]")],
    "CustomMetadata": [("name", "string"), ("data", "[ubyte]")],
    # MediaPipe's segmenter options (image_segmenter_metadata_schema.fbs), a
    # flatbuffer of its own (identifier V001) in a CustomMetadata's data
    "ImageSegmenterOptions": [("activation", "byte"), ("min_parser_version", "string")],
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
    "BoundingBoxProperties": [("index", "[uint]"), ("type", "byte"), ("coordinate_type", "byte")],
    # MediaPipe's detector options (object_detector_metadata_schema.fbs), a
    # flatbuffer of its own (identifier V001) in a CustomMetadata's data
    "ObjectDetectorOptions": [("min_parser_version", "string"), ("ssd_anchors_options", "SsdAnchorsOptions"),
                              ("tensors_decoding_options", "TensorsDecodingOptions")],
    "SsdAnchorsOptions": [("fixed_anchors_schema", "FixedAnchorsSchema")],
    "FixedAnchorsSchema": [("anchors", "[FixedAnchor]")],
    "FixedAnchor": [("x_center", "float"), ("y_center", "float"), ("width", "float"), ("height", "float")],
    "TensorsDecodingOptions": [("num_classes", "int"), ("num_boxes", "int"), ("num_coords", "int"),
                               ("keypoint_coord_offset", "int"), ("num_keypoints", "int"),
                               ("num_values_per_keypoint", "int"), ("x_scale", "float"), ("y_scale", "float"),
                               ("w_scale", "float"), ("h_scale", "float"), ("apply_exponential_on_box_size", "bool"),
                               ("sigmoid_score", "bool")],
}
UNIONS = {"content_properties": {CONTENT_FEATURE: "FeatureProperties", CONTENT_IMAGE: "ImageProperties",
                                 CONTENT_BOUNDING_BOX: "BoundingBoxProperties"},
          "options": {UNIT_NORMALIZATION: "NormalizationOptions"}}
# each scalar kind: (its struct format, the builder's method that writes it)
_SCALARS = {"byte": ("<b", "PrependInt8Slot"), "utype": ("<B", "PrependUint8Slot"),
            "uint": ("<I", "PrependUint32Slot"), "int": ("<i", "PrependInt32Slot"),
            "float": ("<f", "PrependFloat32Slot"), "bool": ("<?", "PrependBoolSlot")}


def standard_metadata(doc: dict, anchors: np.ndarray | None = None) -> dict:
    """The ModelMetadata of an image classifier, segmenter or detector, as a
    dict of the schema's fields, built from edgevit's metadata document
    ``doc`` (:func:`edgevit.litert.metadata.build_metadata`), so the two
    entries cannot say different things; ``anchors``: a raw detector's."""
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
    image_input = {
        "name": "image",
        "description": input_text,
        "content": {"content_properties": (CONTENT_IMAGE, {
            "color_space": COLOR_RGB, "default_size": {"width": size, "height": size}})},
        "process_units": [{"options": (UNIT_NORMALIZATION, {"mean": mean, "std": std})}],
        "stats": {"max": high, "min": low},
    }
    if task_of(doc) == SEGMENTATION:
        return _segmenter_metadata(doc, size, image_input, labels_file)
    if task_of(doc) == DETECTION:
        return _detector_metadata(doc, size, image_input, labels_file, anchors)
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
            "input_tensor_metadata": [image_input],
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


def _segmenter_metadata(doc: dict, size: int, image_input: dict, labels_file: dict) -> dict:
    """A segmenter's ModelMetadata, as MediaPipe's ImageSegmenter reads it:
    the image input as a classifier's; the output a map of logits
    ([1, h, w, classes] at the output stride: dimensions 1-2 the image,
    the last the classes, labelled); the softmax named in the subgraph's
    custom metadata, which MediaPipe applies to its confidence masks after
    resizing the logits to the image (its category mask is their argmax)."""
    pre, out = doc["preprocessing"], doc["output"]
    _, height, width, _ = out["shape"]
    segmenter_options = serialize({"activation": ACTIVATION_SOFTMAX, "min_parser_version": SEGMENTER_PARSER_VERSION},
                                  "ImageSegmenterOptions", SEGMENTER_IDENTIFIER)
    return {
        "name": doc["model"],
        "description": (f"{doc['model']} ({doc['family']}) image segmenter, {doc['precision']}, "
                        f"{doc['num_classes']} classes, {size}x{size} input ({pre['interpolation']} resize); outputs "
                        f"the logits of each class at {height}x{width}: resize them bilinearly to the image and "
                        f"take the argmax. Weights: {doc['weights']}."),
        "version": f"edgevit {doc['edgevit_version']}",
        "author": "edgevit",
        "license": doc.get("licence") or "",
        "min_parser_version": MIN_PARSER_VERSION_CUSTOM,
        "subgraph_metadata": [{
            "input_tensor_metadata": [image_input],
            "output_tensor_metadata": [{
                "name": SEGMENTATION_OUTPUT,
                "description": (f"Logit of each class at each place of a {height}x{width} map (no softmax: "
                                "the softmax is the segmenter metadata's activation)."),
                "content": {"content_properties": (CONTENT_IMAGE, {
                    "color_space": COLOR_GRAYSCALE, "default_size": {"width": width, "height": height}}),
                    "range": {"min": 1, "max": 2}},
                "associated_files": [labels_file],
            }],
            "custom_metadata": [{"name": SEGMENTER_METADATA, "data": segmenter_options}],
        }],
    }


def _detector_metadata(doc: dict, size: int, image_input: dict, labels_file: dict,
                       anchors: np.ndarray | None) -> dict:
    """A detector's ModelMetadata, as MediaPipe's ObjectDetector reads it.
    The raw form (what Model Maker ships): outputs ``location`` (the box
    regressions, y first) and ``score`` (each class's softmax score, the
    labels along its last axis), and in the subgraph's custom metadata
    DETECTOR_METADATA the anchors and how to decode the boxes against them,
    scores as they are (no sigmoid: the file's softmax made them). The NMS
    form (what the Task Library requires): the four outputs of the detection
    post-processing op, named as both clients look them up, the labels on
    the category tensor's values."""
    pre, detection = doc["preprocessing"], doc["detection"]
    classes = doc["num_classes"]
    location = {"name": "location", "content": {"content_properties": (CONTENT_BOUNDING_BOX, {
        "index": list(BOX_INDEX), "type": BOUNDARIES, "coordinate_type": RATIO})}}
    common = {
        "name": doc["model"],
        "version": f"edgevit {doc['edgevit_version']}",
        "author": "edgevit",
        "license": doc.get("licence") or "",
        "min_parser_version": MIN_PARSER_VERSION_CUSTOM,
    }
    described = (f"{doc['model']} ({doc['family']}) SSD object detector, {doc['precision']}, {classes} classes, "
                 f"{size}x{size} input ({pre['interpolation']} resize of the whole image).")
    if detection["form"] == NMS_FORM:
        values = {"range": {"min": 2, "max": 2}}
        location["description"] = "Boxes kept, (ymin, xmin, ymax, xmax) normalised to [0, 1]."
        location["content"]["range"] = values["range"]
        outputs = [location,
                   {"name": "category", "description": "Class of each box (a line of the labels, from 0).",
                    "content": {"content_properties": (CONTENT_FEATURE, {}), **values},
                    "associated_files": [{**labels_file, "type": LABELS_TYPE_VALUE}]},
                   {"name": "score", "description": "Score of each box (softmax).",
                    "content": {"content_properties": (CONTENT_FEATURE, {}), **values}},
                   {"name": "number of detections", "description": "How many boxes are kept.",
                    "content": {"content_properties": (CONTENT_FEATURE, {})}}]
        return {**common, "description": described + " Detection post-processing (NMS) inside the file.",
                "subgraph_metadata": [{"input_tensor_metadata": [image_input], "output_tensor_metadata": outputs}]}
    if anchors is None:
        raise EdgevitError("A raw detector's metadata needs its anchors.")
    scales = detection["box_scales"]
    options = {
        "min_parser_version": DETECTOR_PARSER_VERSION,
        "ssd_anchors_options": {"fixed_anchors_schema": {"anchors": [
            {"y_center": float(y), "x_center": float(x), "height": float(h), "width": float(w)}
            for y, x, h, w in np.asarray(anchors, dtype=np.float32)]}},
        "tensors_decoding_options": {
            # no keypoints; MediaPipe checks that each would have 2 values all the same
            "num_classes": classes, "num_boxes": int(len(anchors)), "num_coords": 4, "num_values_per_keypoint": 2,
            "y_scale": scales[0], "x_scale": scales[1], "h_scale": scales[2], "w_scale": scales[3],
            "apply_exponential_on_box_size": True, "sigmoid_score": False},
    }
    location["description"] = ("Box regression of each anchor, (ty, tx, th, tw) against the anchors in "
                               f"{DETECTOR_METADATA}, scales {_listed(scales)}.")
    score = {"name": "score", "description": "Softmax score of each class at each anchor (background left out).",
             "content": {"content_properties": (CONTENT_FEATURE, {})},
             "stats": {"max": [1.0], "min": [0.0]}, "associated_files": [labels_file]}
    return {**common, "description": described + " Raw boxes and scores: decode against the anchors and "
                                                 "suppress overlaps (MediaPipe's ObjectDetector does both).",
            "subgraph_metadata": [{
                "input_tensor_metadata": [image_input], "output_tensor_metadata": [location, score],
                "custom_metadata": [{"name": DETECTOR_METADATA,
                                     "data": serialize(options, "ObjectDetectorOptions", DETECTOR_IDENTIFIER)}]}]}


def segmenter_activation(standard: dict) -> int | None:
    """The activation a parsed entry's SEGMENTER_METADATA names (None: the
    entry has none, or one that cannot be read)."""
    for subgraph in standard.get("subgraph_metadata") or []:
        for custom in subgraph.get("custom_metadata") or []:
            data = custom.get("data")
            if custom.get("name") != SEGMENTER_METADATA or not data:
                continue
            try:
                if data[4:8] != SEGMENTER_IDENTIFIER:
                    return None
                reader = _BoundedReader(data)
                return reader.table(reader.target(0), "ImageSegmenterOptions").get("activation", ACTIVATION_NONE)
            except ValueError:
                return None
    return None


def detector_options(standard: dict) -> dict | None:
    """The ObjectDetectorOptions a parsed entry's DETECTOR_METADATA holds
    (None: the entry has none, or one that cannot be read)."""
    for subgraph in standard.get("subgraph_metadata") or []:
        for custom in subgraph.get("custom_metadata") or []:
            data = custom.get("data")
            if custom.get("name") != DETECTOR_METADATA or not data:
                continue
            try:
                if data[4:8] != DETECTOR_IDENTIFIER:
                    return None
                reader = _BoundedReader(data)
                return reader.table(reader.target(0), "ObjectDetectorOptions")
            except ValueError:
                return None
    return None


def anchors_of_options(options: dict) -> np.ndarray:
    """The anchors of ObjectDetectorOptions, [A, 4] (ycenter, xcenter, height, width)."""
    anchors = ((options.get("ssd_anchors_options") or {}).get("fixed_anchors_schema") or {}).get("anchors") or []
    return np.asarray([[a.get(k, 0.0) for k in ("y_center", "x_center", "height", "width")] for a in anchors],
                      dtype=np.float32).reshape(-1, 4)


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


def serialize(metadata: dict, table: str = "ModelMetadata", identifier: bytes = FILE_IDENTIFIER) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(_build(builder, table, metadata), file_identifier=identifier)
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


def _vector(b: flatbuffers.Builder, element: str, values) -> int:
    if element == "ubyte":  # CustomMetadata.data: the schema aligns it to 16 bytes (force_align)
        b.StartVector(1, len(values), 16)
        b.head -= len(values)
        b.Bytes[b.head:b.head + len(values)] = values
        return b.EndVector()
    if element in ("float", "uint"):
        prepend = b.PrependFloat32 if element == "float" else b.PrependUint32
        b.StartVector(4, len(values), 4)
        for v in reversed(values):
            prepend(float(v) if element == "float" else int(v))
        return b.EndVector()
    children = [b.CreateString(v) if element == "string" else _build(b, element, v) for v in values]
    b.StartVector(4, len(children), 4)
    for child in reversed(children):
        b.PrependUOffsetTRelative(child)
    return b.EndVector()


def read_standard(content: bytes) -> dict | None:
    """The TFLITE_METADATA entry as a dict of the schema's fields (unions as
    (member, fields)), with ``files``: the packed files it names, by name;
    None when the file has no such entry."""
    data = metadata_entry(content, METADATA_NAME)
    if data is None:
        return None
    try:
        if data[4:8] != FILE_IDENTIFIER:
            raise ValueError("no M001 file identifier")
        reader = _BoundedReader(data)
        parsed = reader.table(reader.target(0), "ModelMetadata")
    except ValueError as err:
        raise EdgevitError(f"The {METADATA_NAME} entry is not a readable ModelMetadata flatbuffer ({err}).") \
            from None
    parsed["files"] = packed_files(content, named_files(parsed))
    return parsed


def named_files(table: dict) -> list[str]:
    """The names of the associated files a parsed table (the entry
    :func:`read_standard` returns) names, at any depth."""
    names = [entry.get("name") for entry in table.get("associated_files") or []]
    for value in table.values():
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, tuple):
                child = child[1]
            if isinstance(child, dict):
                names += named_files(child)
    return [name for name in names if name]


class _BoundedReader:
    """Reads a ModelMetadata flatbuffer by SCHEMA, every offset checked
    against the buffer's bounds (ValueError where one points outside), and
    the bytes of every table, vector and string it visits counted against
    MAX_REFERENCED_PER_BYTE times the buffer's size."""

    def __init__(self, data: bytes):
        self.data = data
        self.left = MAX_REFERENCED_PER_BYTE * len(data)

    def get(self, fmt: str, at: int):
        if not 0 <= at <= len(self.data) - struct.calcsize(fmt):
            raise ValueError(f"an offset points outside its {len(self.data)} bytes")
        return struct.unpack_from(fmt, self.data, at)[0]

    def visit(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise ValueError(f"it references more than its {len(self.data):,} bytes can hold: tables shared over "
                             "and over")

    def target(self, at: int) -> int:
        """Where the offset stored at ``at`` points."""
        return at + self.get("<I", at)

    def table(self, at: int, table: str) -> dict:
        self.visit(4)
        vtable = at - self.get("<i", at)
        vtable_size = self.get("<H", vtable)
        fields = SCHEMA[table]
        slots = [self.get("<H", vtable + 4 + 2 * slot) if 4 + 2 * slot < vtable_size else 0
                 for slot in range(len(fields))]
        out: dict = {}
        for slot, (name, kind) in enumerate(fields):
            if not slots[slot] or kind == "utype":
                continue
            field_at = at + slots[slot]
            if kind in _SCALARS:
                out[name] = self.get(_SCALARS[kind][0], field_at)
            elif kind == "string":
                out[name] = self.string(self.target(field_at))
            elif kind == "union":
                member = self.get("<B", at + slots[slot - 1]) if slots[slot - 1] else 0
                member_table = UNIONS[name].get(member)
                out[name] = (member, self.table(self.target(field_at), member_table) if member_table else {})
            elif kind.startswith("["):
                out[name] = self.vector(self.target(field_at), kind[1:-1])
            else:
                out[name] = self.table(self.target(field_at), kind)
        return out

    def vector(self, at: int, element: str) -> list:
        count = self.get("<I", at)
        self.visit(4 + (1 if element == "ubyte" else 4) * count)
        start = at + 4
        if element == "ubyte":
            if start + count > len(self.data):
                raise ValueError(f"a byte vector runs past its {len(self.data)} bytes")
            return self.data[start:start + count]
        if element in ("float", "uint"):
            code = "f" if element == "float" else "I"
            if count:
                self.get(f"<{code}", start + 4 * count - 4)  # the last one lies inside the buffer
            return list(struct.unpack_from(f"<{count}{code}", self.data, start))
        if element == "string":
            return [self.string(self.target(start + 4 * i)) for i in range(count)]
        return [self.table(self.target(start + 4 * i), element) for i in range(count)]

    def string(self, at: int) -> str:
        length = self.get("<I", at)
        self.visit(4 + length)
        if at + 4 + length > len(self.data):
            raise ValueError(f"a string runs past its {len(self.data)} bytes")
        try:
            return self.data[at + 4:at + 4 + length].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("a string is not UTF-8 text") from None
