"""Whether what a file's metadata says is what the file is: edgevit's entry
against the graph's tensors, and the standard entry against both. A file
edited by hand, or assembled from another model's parts, otherwise gets
trusted: labelled with the wrong precision by `bench`, evaluated against the
wrong class count, or shipped to the app with labels that do not fit."""
from __future__ import annotations

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import Graph, read
from edgevit.litert.logits_view import closing_softmax
from edgevit.litert.metadata import TAKES_RGB_BYTES, read_embedded
from edgevit.litert.standard_metadata import read_standard, standard_metadata

# precisions whose files compute in integers (their activations are quantized)
QUANTIZED_PRECISIONS = ("int8", "int8_mixed", "int16x8")


def metadata_problems(content: bytes) -> list[str]:
    """Each contradiction found, in a sentence (empty: none found, or no
    metadata to contradict)."""
    graph = read(content)
    problems: list[str] = []
    try:
        edgevit = read_embedded(content)
    except EdgevitError as err:
        return [str(err)]
    try:
        standard = read_standard(content)
    except EdgevitError as err:
        problems.append(str(err))
        standard = None
    if edgevit:
        problems += _edgevit_against_graph(edgevit, graph)
    if standard:
        problems += _standard_against(standard, edgevit, graph)
    return problems


def _edgevit_against_graph(meta: dict, graph: Graph) -> list[str]:
    image, scores = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    said_in, said_out = meta.get("input") or {}, meta.get("output") or {}
    problems = [f"edgevit metadata says the {what} is {said.get('dtype')} {list(said.get('shape') or [])}; "
                f"the graph's is {tensor.dtype} {list(tensor.shape)}"
                for what, said, tensor in (("input", said_in, image), ("output", said_out, scores))
                if list(said.get("shape") or []) != list(tensor.shape) or said.get("dtype") != tensor.dtype]
    classes = scores.shape[-1] if scores.shape else 0
    if meta.get("num_classes") != classes or len(meta.get("labels") or []) != classes:
        problems.append(f"edgevit metadata says {meta.get('num_classes')} classes with "
                        f"{len(meta.get('labels') or [])} labels; the graph outputs {classes}")
    quantized = any(t.dtype in ("int8", "uint8", "int16") for op in graph.ops for t in op.outputs)
    precision = meta.get("precision")
    if precision is not None and (precision in QUANTIZED_PRECISIONS) != quantized:
        problems.append(f"edgevit metadata says {precision}; the graph computes in "
                        f"{'integers' if quantized else 'float'}")
    kind = said_out.get("kind")
    ends_in_softmax = closing_softmax(graph) is not None
    if kind == "probabilities" and not ends_in_softmax:
        problems.append("edgevit metadata says the file outputs probabilities; the graph does not end in a softmax")
    if said_in.get("takes") == TAKES_RGB_BYTES and image.dtype != "uint8":
        problems.append(f"edgevit metadata says the input takes the camera's bytes; the graph's is {image.dtype}")
    return problems


def _standard_against(standard: dict, edgevit: dict | None, graph: Graph) -> list[str]:
    problems = []
    classes = graph.tensors[graph.outputs[0]].shape[-1]
    labels = _standard_labels(standard)
    if labels is None:
        problems.append("the standard metadata names no labels file packed in the model")
    elif len(labels) != classes:
        problems.append(f"the standard metadata's labels file has {len(labels)} labels; the graph outputs {classes}")
    if edgevit is None:
        return problems
    if labels is not None and labels != list(edgevit.get("labels") or []):
        problems.append("the standard metadata's labels differ from edgevit metadata's")
    try:
        expected = standard_metadata(edgevit)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return problems + ["edgevit metadata lacks what the standard metadata is built from"]
    if _normalization(standard) != _normalization(expected):
        problems.append(f"the standard metadata normalises with mean/std {_normalization(standard)}; edgevit "
                        f"metadata's preprocessing means {_normalization(expected)}")
    if _output_name(standard) != _output_name(expected):
        problems.append(f"the standard metadata names the output {_output_name(standard)!r}; edgevit metadata "
                        f"says {edgevit['output'].get('kind')}")
    if standard.get("name") != expected["name"]:
        problems.append(f"the standard metadata names the model {standard.get('name')!r}; edgevit metadata "
                        f"{expected['name']!r}")
    return problems


def _tensor(standard: dict, side: str) -> dict:
    try:
        return standard["subgraph_metadata"][0][f"{side}_tensor_metadata"][0]
    except (KeyError, IndexError, TypeError):
        return {}


def _standard_labels(standard: dict) -> list[str] | None:
    for entry in _tensor(standard, "output").get("associated_files") or []:
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
        summary["edgevit"] = {key: edgevit.get(key) for key in ("model", "precision", "weights", "num_classes")}
        summary["edgevit"].update({"input": (edgevit.get("input") or {}).get("takes", "normalised"),
                                   "output": (edgevit.get("output") or {}).get("kind")})
    if standard:
        labels = _standard_labels(standard)
        summary["standard"] = {"name": standard.get("name"), "version": standard.get("version"),
                               "licence": standard.get("license") or None,
                               "normalization_mean_std": _normalization(standard),
                               "output": _output_name(standard), "labels": len(labels) if labels is not None else None,
                               "min_parser_version": standard.get("min_parser_version")}
    return summary
