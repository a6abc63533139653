"""Whether what a file's metadata says is what the file is: edgevit's entry
against the graph's tensors, and the standard entry against both, for
everything an app computes with (the input's size, type, quantization and
the values it takes; the output's type and quantization; whether the graph
ends in a softmax; the labels). A file edited by hand, or assembled from
another model's parts, otherwise gets trusted: labelled with the wrong
precision by `bench`, evaluated with the wrong preprocessing, or shipped to
the app with labels and quantization that do not fit."""
from __future__ import annotations

import math

from edgevit.errors import EdgevitError
from edgevit.litert.camera_input import single_scale
from edgevit.litert.flatbuffer import Graph, Tensor, read
from edgevit.litert.logits_view import closing_softmax
from edgevit.litert.detection_postprocess import postprocessing_ops
from edgevit.litert.metadata import DETECTION, QUANTIZED_PRECISIONS, SEGMENTATION, TAKES_NORMALISED, TAKES_RGB_BYTES, \
    TAKES_RGB_UNIT, read_embedded, task_of
from edgevit.litert.metadata_fields import document_problems
from edgevit.litert.packed_files import packed_names
from edgevit.litert.standard_metadata import ACTIVATION_NONE, ACTIVATION_SOFTMAX, DETECTOR_METADATA, NMS_FORM, \
    SEGMENTER_METADATA, anchors_of_options, detector_options, named_files, read_standard, segmenter_activation, \
    standard_metadata

# The integer values of each quantized type.
LEVELS = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767)}
# How far a quantized input's grid may stray from the values the metadata
# says it takes: calibrated grids cover most of the normalised range; a
# grid of bytes 0-255 said to take values in [-2, 2] is 64 times too wide.
GRID_SPAN_RATIO = 4.0
# What the metadata rounds a float32 scale to: JSON writes Python's float.
SCALE_TOLERANCE = 1e-6


def metadata_problems(content: bytes) -> list[str]:
    """Each contradiction found, in a sentence (empty: none found, or no
    metadata to contradict)."""
    graph = read(content)
    problems: list[str] = []
    try:
        edgevit = read_embedded(content)
    except EdgevitError as err:
        problems.append(_problem(err))
        edgevit = None
    try:
        standard = read_standard(content)
    except EdgevitError as err:
        problems.append(_problem(err))
        standard = None
    if edgevit:
        found = document_against_graph(edgevit, graph)
        problems += found
        edgevit = None if found else edgevit  # a document that contradicts the graph is no reference
    if standard:
        problems += _standard_against(standard, edgevit, graph)
        unnamed = [name for name in packed_names(content) if name not in named_files(standard)]
        if unnamed:
            problems.append(f"the zip packed in the model holds {len(unnamed)} file(s) no metadata names "
                            f"({', '.join(map(repr, unnamed[:3]))}{' ...' if len(unnamed) > 3 else ''})")
    return problems


def _problem(err: EdgevitError) -> str:
    """A reader's error as one of the problems listed: a clause, as the others."""
    text = str(err)
    return text[:1].lower() + text[1:].rstrip(".")


def document_against_graph(meta: dict, graph: Graph) -> list[str]:
    """Where edgevit's metadata document ``meta`` is malformed or
    contradicts ``graph`` (empty: it describes the graph)."""
    malformed = document_problems(meta)
    if malformed:
        return malformed
    image, scores = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    said_in, said_out = meta["input"], meta["output"]
    problems = [f"edgevit metadata says the {what} is {said['dtype']} {said['shape']}; "
                f"the graph's is {tensor.dtype} {list(tensor.shape)}"
                for what, said, tensor in (("input", said_in, image), ("output", said_out, scores))
                if said["shape"] != list(tensor.shape) or said["dtype"] != tensor.dtype]
    problems += [f"edgevit metadata says the {what}'s quantization is {_quantization(said.get('quantization'))}; "
                 f"the graph's is {_quantization(_graph_quantization(tensor))}"
                 for what, said, tensor in (("input", said_in, image), ("output", said_out, scores))
                 if not _same_quantization(said.get("quantization"), _graph_quantization(tensor))]
    if task_of(meta) == DETECTION:
        return problems + _detection_problems(meta, graph) + _input_problems(meta, image)
    classes = scores.shape[-1] if scores.shape else 0
    if meta["num_classes"] != classes or len(meta["labels"]) != classes:
        problems.append(f"edgevit metadata says {meta['num_classes']} classes with {len(meta['labels'])} labels; "
                        f"the graph outputs {classes}")
    quantized = any(t.dtype in LEVELS for op in graph.ops for t in op.outputs)
    if (meta["precision"] in QUANTIZED_PRECISIONS) != quantized:
        problems.append(f"edgevit metadata says {meta['precision']}; the graph computes in "
                        f"{'integers' if quantized else 'float'}")
    segmenter, maps = task_of(meta) == SEGMENTATION, len(scores.shape) == 4
    if segmenter != maps:
        problems.append(f"edgevit metadata says the file is {'a segmenter' if segmenter else 'a classifier'}; the "
                        f"graph outputs {'a map' if maps else 'a vector'} of class scores {list(scores.shape)}")
    ends_in_softmax = closing_softmax(graph) is not None
    if said_out["kind"] == "probabilities" and not ends_in_softmax:
        problems.append("edgevit metadata says the file outputs probabilities; the graph does not end in a softmax")
    if said_out["kind"] == "logits" and ends_in_softmax:
        problems.append("edgevit metadata says the file outputs logits; the graph ends in a softmax (probabilities)")
    return problems + _input_problems(meta, image)


def _detection_problems(meta: dict, graph: Graph) -> list[str]:
    """Where a detector's document contradicts the graph: its outputs, its
    classes (the raw form's score columns), its form."""
    block = meta.get("detection")
    if not isinstance(block, dict) or not isinstance(block.get("outputs"), list):
        return ["edgevit metadata of a detector has no detection block describing its outputs"]
    said = [(o.get("shape"), o.get("dtype")) for o in block["outputs"] if isinstance(o, dict)]
    found = [(list(graph.tensors[i].shape), graph.tensors[i].dtype) for i in graph.outputs]
    if said != found:
        return [f"edgevit metadata says the detector outputs {said}; the graph's are {found}"]
    problems = []
    postprocessing = bool(postprocessing_ops(graph))
    if (block.get("form") == NMS_FORM) != postprocessing:
        problems.append(f"edgevit metadata says the detector's form is {block.get('form')!r}; the graph "
                        f"{'ends' if postprocessing else 'does not end'} in the detection post-processing op")
    elif not postprocessing and (meta["num_classes"] != found[-1][0][-1] or len(meta["labels"]) != found[-1][0][-1]):
        problems.append(f"edgevit metadata says {meta['num_classes']} classes with {len(meta['labels'])} labels; "
                        f"the graph scores {found[-1][0][-1]}")
    return problems


def _input_problems(meta: dict, image: Tensor) -> list[str]:
    """Where the preprocessing and the values the input takes contradict
    the graph's input tensor."""
    pre, takes = meta["preprocessing"], meta["input"].get("takes", TAKES_NORMALISED)
    problems = []
    if len(image.shape) == 4 and image.shape[1:3] != (pre["input_size"], pre["input_size"]):
        problems.append(f"edgevit metadata's preprocessing.input_size is {pre['input_size']}; the graph's input is "
                        f"{image.shape[1]}x{image.shape[2]} pixels")
    if image.dtype not in LEVELS or image.scale is None:
        if takes == TAKES_RGB_BYTES:
            problems.append(f"edgevit metadata says the input takes the camera's bytes; the graph's is {image.dtype}")
        return problems
    low, high = ((level - image.zero_point) * image.scale for level in LEVELS[image.dtype])
    holds = f"the graph's {image.dtype} input holds [{low:g}, {high:g}] (scale {image.scale:g}, zero point " \
            f"{image.zero_point})"
    if takes == TAKES_RGB_BYTES:
        grids = [(1.0, 0), single_scale(pre["mean"], pre["std"])]
        if image.dtype != "uint8" or not any(grid and math.isclose(image.scale, grid[0], rel_tol=SCALE_TOLERANCE)
                                             and image.zero_point == grid[1] for grid in grids):
            problems.append(f"edgevit metadata says the input takes the camera's bytes; {holds}, which is neither "
                            "the bytes nor the image they normalise to")
        return problems
    wanted_low, wanted_high = (0.0, 1.0) if takes == TAKES_RGB_UNIT else _normalised_range(pre)
    span, wanted = high - low, wanted_high - wanted_low
    overlap = min(high, wanted_high) - max(low, wanted_low)
    if span > GRID_SPAN_RATIO * wanted or wanted > GRID_SPAN_RATIO * span or overlap < wanted / 2:
        what = "pixels in [0, 1]" if takes == TAKES_RGB_UNIT else "the normalised image"
        problems.append(f"edgevit metadata says the input takes {what}, values in [{wanted_low:g}, "
                        f"{wanted_high:g}]; {holds}")
    return problems


def _normalised_range(pre: dict) -> tuple[float, float]:
    """The values (pixel - mean) / std takes for pixels in [0, 1]."""
    return (min((0.0 - m) / s for m, s in zip(pre["mean"], pre["std"])),
            max((1.0 - m) / s for m, s in zip(pre["mean"], pre["std"])))


def _graph_quantization(tensor: Tensor) -> dict | None:
    return None if tensor.scale is None else {"scale": tensor.scale, "zero_point": tensor.zero_point}


def _same_quantization(said: dict | None, graph: dict | None) -> bool:
    if said is None or graph is None:
        return said is None and graph is None
    return math.isclose(said["scale"], graph["scale"], rel_tol=SCALE_TOLERANCE) and \
        said["zero_point"] == graph["zero_point"]


def _quantization(quantization: dict | None) -> str:
    return "none" if quantization is None else \
        f"scale {quantization['scale']:g}, zero point {quantization['zero_point']}"


def _standard_against(standard: dict, edgevit: dict | None, graph: Graph) -> list[str]:
    """Where the standard entry contradicts the graph, and ``edgevit``'s
    document (None: there is none to compare with)."""
    problems = []
    image = graph.tensors[graph.inputs[0]]
    detector = len(graph.outputs) > 1
    classes = graph.tensors[graph.outputs[-1 if detector else 0]].shape[-1]
    labels = _standard_labels(standard)
    if labels is None:
        problems.append("the standard metadata names no labels file packed in the model")
    elif len(labels) != classes and not (detector and postprocessing_ops(graph)):
        problems.append(f"the standard metadata's labels file has {len(labels)} labels; the graph outputs {classes}")
    normalization = _normalization(standard)
    if image.dtype == "uint8" and normalization not in (None, [[0.0], [1.0]]):
        problems.append(f"the standard metadata normalises the uint8 input with mean/std {normalization}; "
                        "clients feed a uint8 input the image's bytes as they are")
    output = _output_name(standard)
    ends_in_softmax = closing_softmax(graph) is not None
    if output in ("probability", "logits") and (output == "probability") != ends_in_softmax:
        problems.append(f"the standard metadata names the output {output!r}; the graph "
                        f"{'ends' if ends_in_softmax else 'does not end'} in a softmax")
    if len(graph.tensors[graph.outputs[0]].shape) == 4:
        problems += _segmenter_problems(standard, ends_in_softmax)
    options = detector_options(standard)
    if detector and not postprocessing_ops(graph):
        problems += _raw_detector_problems(options, graph)
    if edgevit is None:
        return problems
    if labels is not None and labels != edgevit["labels"]:
        problems.append("the standard metadata's labels differ from edgevit metadata's")
    raw_detector = detector and not postprocessing_ops(graph)
    if raw_detector and options is None:
        return problems
    expected = standard_metadata(edgevit, anchors_of_options(options) if raw_detector else None)
    if normalization != _normalization(expected):
        problems.append(f"the standard metadata normalises with mean/std {normalization}; edgevit "
                        f"metadata's preprocessing means {_normalization(expected)}")
    if output != _output_name(expected):
        problems.append(f"the standard metadata names the output {output!r}; edgevit metadata "
                        f"says {edgevit['output']['kind']}")
    if standard.get("name") != expected["name"]:
        problems.append(f"the standard metadata names the model {standard.get('name')!r}; edgevit metadata "
                        f"{expected['name']!r}")
    return problems


def _segmenter_problems(standard: dict, ends_in_softmax: bool) -> list[str]:
    """Where the standard entry of a segmenter (a file that outputs a map)
    misleads MediaPipe's ImageSegmenter: no activation named (it takes
    NONE: confidence masks of logits), or a softmax over probabilities."""
    activation = segmenter_activation(standard)
    if activation is None:
        return [f"the standard metadata of a segmenter names no readable activation ({SEGMENTER_METADATA}): "
                "MediaPipe's ImageSegmenter would take NONE"]
    if ends_in_softmax and activation == ACTIVATION_SOFTMAX:
        return ["the standard metadata names a softmax for a segmenter whose graph ends in one"]
    if not ends_in_softmax and activation == ACTIVATION_NONE:
        return ["the standard metadata names no activation for a segmenter that outputs logits: MediaPipe's "
                "confidence masks would be logits"]
    return []


def _raw_detector_problems(options: dict | None, graph: Graph) -> list[str]:
    """Where a raw detector's DETECTOR_METADATA misleads MediaPipe's
    ObjectDetector: none to read, anchors or classes that do not fit the
    outputs, a sigmoid over the softmax scores."""
    if options is None:
        return [f"the standard metadata of a raw detector names no readable anchors and box decoding "
                f"({DETECTOR_METADATA}): MediaPipe's ObjectDetector refuses it"]
    decoding = options.get("tensors_decoding_options") or {}
    boxes, scores = (graph.tensors[i].shape for i in graph.outputs[:2])
    problems = []
    if len(anchors_of_options(options)) != boxes[1] or decoding.get("num_boxes") != boxes[1]:
        problems.append(f"the standard metadata's {DETECTOR_METADATA} holds {len(anchors_of_options(options))} "
                        f"anchors for {decoding.get('num_boxes')} boxes; the graph outputs {boxes[1]}")
    if decoding.get("num_classes") != scores[-1]:
        problems.append(f"the standard metadata's {DETECTOR_METADATA} decodes {decoding.get('num_classes')} "
                        f"classes; the graph scores {scores[-1]}")
    if decoding.get("sigmoid_score") and any(op.name == "SOFTMAX" for op in graph.ops):
        problems.append(f"the standard metadata's {DETECTOR_METADATA} applies a sigmoid to the softmax scores")
    return problems


def _tensor(standard: dict, side: str) -> dict:
    try:
        return standard["subgraph_metadata"][0][f"{side}_tensor_metadata"][0]
    except (KeyError, IndexError, TypeError):
        return {}


def _standard_labels(standard: dict) -> list[str] | None:
    """The labels file of the first output that names one (a detector's
    labels are on its scores, or on its categories)."""
    try:
        outputs = standard["subgraph_metadata"][0]["output_tensor_metadata"]
    except (KeyError, IndexError, TypeError):
        return None
    for tensor in outputs:
        for entry in tensor.get("associated_files") or []:
            data = standard.get("files", {}).get(entry.get("name"))
            if data is not None:
                return data.decode("utf-8", errors="replace").splitlines()
    return None


def _normalization(standard: dict) -> list | None:
    for unit in _tensor(standard, "input").get("process_units") or []:
        _, options = unit.get("options", (0, {}))
        if "mean" in options:
            return [[round(v, 3) for v in options["mean"]], [round(v, 3) for v in options.get("std", [])]]
    return None


def _output_name(standard: dict) -> str | None:
    return _tensor(standard, "output").get("name")


def trusted_metadata(content: bytes) -> dict | None:
    """The embedded edgevit document, where the file's metadata contradicts
    nothing (None: no document, or one not to compute with)."""
    return None if metadata_problems(content) else read_embedded(content)


def check_metadata(content: bytes, name: str) -> None:
    """One error line when ``content``'s metadata contradicts itself or the graph."""
    problems = metadata_problems(content)
    if problems:
        raise EdgevitError(f"{name}: its metadata contradicts the file ({problems[0]}"
                           + (f"; {len(problems) - 1} more" if len(problems) > 1 else "")
                           + "): convert the model again, or fix the file that was edited.")


def metadata_summary(content: bytes) -> dict:
    """What each metadata entry says of the file, and the contradictions:
    what `edgevit check` shows."""
    try:
        edgevit = read_embedded(content)
    except EdgevitError:
        edgevit = None
    try:
        standard = read_standard(content)
    except EdgevitError:
        standard = None
    summary: dict = {"edgevit": None, "standard": None, "problems": metadata_problems(content)}
    if edgevit:
        said_in, said_out = (edgevit.get(side) if isinstance(edgevit.get(side), dict) else {}
                             for side in ("input", "output"))
        summary["edgevit"] = {key: edgevit.get(key) for key in ("model", "precision", "weights", "num_classes")}
        summary["edgevit"]["task"] = task_of(edgevit)
        summary["edgevit"].update({"input": said_in.get("takes", TAKES_NORMALISED), "output": said_out.get("kind")})
    if standard:
        labels = _standard_labels(standard)
        summary["standard"] = {"name": standard.get("name"), "version": standard.get("version"),
                               "licence": standard.get("license") or None,
                               "normalization_mean_std": _normalization(standard),
                               "output": _output_name(standard), "labels": len(labels) if labels is not None else None,
                               "min_parser_version": standard.get("min_parser_version")}
    return summary
