"""Put an exported model into the Android demo app (``android_demo/``).

The app reads three assets under fixed names, so any edgevit model works
without code changes:

- ``app/src/main/assets/model.tflite``: the model,
- ``app/src/main/assets/model.json``: its metadata (docs/model-metadata.md),
- ``app/src/main/assets/labels.txt``: one label per line.

The three files are written to a staging folder next to them and moved into
place together only after every check passed, so a failed bundle leaves the
app's previous assets untouched. Nothing is written outside the demo folder
(an assets folder that is a symbolic link leading out of it is refused) and
nothing is deleted that an earlier bundle did not write (a folder where an
asset goes is refused). What is shipped is the metadata embedded in the
model, checked against its graph; the sidecars ``NAME.json`` and
``NAME.labels.txt`` beside it must say the same, or the bundle is refused
naming where they differ.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from edgevit.errors import EdgevitError, about, cause, not_there, shell_word
from edgevit.litert.flatbuffer import read, read_file
from edgevit.litert.metadata import DETECTION, SCHEMA, SEGMENTATION, read_embedded, task_of
from edgevit.litert.standard_metadata import NMS_FORM, RAW_FORM, anchors_of_options, detector_options, read_standard
from edgevit.writing import check_folder_writable, staged

ASSETS_DIR = Path("app") / "src" / "main" / "assets"
MODEL_ASSET = "model.tflite"
METADATA_ASSET = "model.json"
LABELS_ASSET = "labels.txt"
# Present at the root of every edgevit Android demo checkout.
DEMO_MARKER = ".edgevit-android-demo"

# The repository carries the Gradle wrapper's properties but not its jar (a
# binary), so a fresh checkout has no gradlew until `gradle wrapper` writes it.
WRAPPER_PROPERTIES = Path("gradle") / "wrapper" / "gradle-wrapper.properties"

# The metadata version the app's ModelMetadata.kt reads (edgevit may write newer ones).
SUPPORTED_SCHEMA_VERSION = 1
SUPPORTED_DTYPES = ("float32", "int8", "uint8")


def check_demo_folder(demo_dir: str | Path) -> Path:
    """Return the assets folder of ``demo_dir`` or raise a clear error."""
    demo = Path(demo_dir)
    if not demo.exists():
        raise EdgevitError(f"Android demo folder {str(demo)!r} {not_there(demo)} "
                           "(pass the android_demo/ folder of the edgevit repository).")
    if not demo.is_dir():
        raise EdgevitError(f"{str(demo)!r} is not a folder (pass the android_demo/ folder).")
    if not (demo / DEMO_MARKER).is_file() or not (demo / "app" / "src" / "main" / "AndroidManifest.xml").is_file():
        raise EdgevitError(f"{str(demo)!r} is not an edgevit Android demo (no {DEMO_MARKER} file and "
                           "app/src/main/AndroidManifest.xml): pass the android_demo/ folder of the "
                           "edgevit repository, or a copy of it.")
    assets = demo / ASSETS_DIR
    if not assets.resolve().is_relative_to(demo.resolve()):
        link = next((p for p in (assets, *assets.parents) if p.is_symlink()), assets)
        raise EdgevitError(f"{str(link)!r} is a symbolic link to {str(assets.resolve())!r}, outside the demo folder "
                           f"{str(demo)!r}: bundle writes only inside it. Make {str(link)!r} a folder.")
    check_folder_writable(assets, "Assets folder")
    try:
        assets.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdgevitError(f"Could not make the assets folder {str(assets)!r}: {cause(err)}.") from None
    for name in (MODEL_ASSET, METADATA_ASSET, LABELS_ASSET):
        if (assets / name).is_dir() and not (assets / name).is_symlink():
            raise EdgevitError(f"{str(assets / name)!r} is a folder where bundle writes the app's {name}: move it "
                               "(bundle replaces only files).")
    return assets


def build_commands(demo_dir: str | Path) -> list[str]:
    """The shell commands that build the app and install it on the phone
    adb sees, from the current folder (android_demo/README.md)."""
    demo = Path(demo_dir)
    commands = [f"cd {shell_word(demo)}"]
    if not (demo / "gradlew").is_file():
        match = re.search(r"gradle-([0-9.]+)-", (demo / WRAPPER_PROPERTIES).read_text(encoding="utf-8")) \
            if (demo / WRAPPER_PROPERTIES).is_file() else None
        commands.append("gradle wrapper" + (f" --gradle-version {match.group(1)}" if match else ""))
    return commands + ["./gradlew installDebug"]


def _sidecars(model_path: Path) -> tuple[Path, Path]:
    stem = model_path.with_suffix("")
    return stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".labels.txt")


def _load_metadata(model_path: Path, content: bytes) -> tuple[dict, str]:
    """The metadata to ship, checked against the file, and where it comes
    from: the embedded document, which ``NAME.json`` must equal, or, for a
    file without one, ``NAME.json`` checked against the graph."""
    from edgevit.litert.metadata_check import check_metadata, document_against_graph

    with about(model_path):
        check_metadata(content, str(model_path))
        embedded = read_embedded(content)
    meta_path, _ = _sidecars(model_path)
    if not meta_path.is_file():
        if embedded is None:
            raise EdgevitError(f"{model_path.name} has no edgevit metadata (no {meta_path.name} next to it and "
                               "none embedded): convert it with `edgevit convert` first.")
        return embedded, "metadata embedded in the model"
    try:
        document = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        reason = "it nests too deeply" if isinstance(err, RecursionError) else err
        raise EdgevitError(f"Metadata file {str(meta_path)!r} is not valid JSON: {reason}") from None
    if not isinstance(document, dict):
        raise EdgevitError(f"Metadata file {str(meta_path)!r} is a JSON {type(document).__name__}, not the object "
                           "`edgevit convert` writes.")
    if embedded is not None and document != embedded:
        raise EdgevitError(f"{meta_path.name} differs from the metadata embedded in {model_path.name} "
                           f"({_difference(document, embedded)}): bundle ships only metadata that agrees with the "
                           f"file. Remove {meta_path.name} to ship the embedded metadata, or convert the model again.")
    problems = [] if embedded is not None else document_against_graph(document, read(content))
    if problems:
        raise EdgevitError(f"{meta_path.name} contradicts {model_path.name} ({problems[0]}"
                           + (f"; {len(problems) - 1} more" if len(problems) > 1 else "") + ").")
    return document, meta_path.name


def _difference(said: dict, embedded: dict, path: str = "") -> str:
    """The first field where a sidecar document and the embedded one differ, in words."""
    for key in dict.fromkeys([*said, *embedded]):
        here = f"{path}.{key}" if path else key
        a, b = said.get(key), embedded.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if a != b:
                return _difference(a, b, here)
        elif a != b:
            return f"{here}: {_shown(a)} where the file says {_shown(b)}"
    return "the same fields, written differently"


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:56] + " ..."


def _labels(labels_path: Path, meta: dict) -> list[str]:
    """The labels to ship: the metadata's, which ``NAME.labels.txt`` must repeat."""
    labels = [str(label) for label in meta.get("labels") or []]
    if not labels_path.is_file():
        return labels
    try:
        lines = labels_path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise EdgevitError(f"Labels file {str(labels_path)!r} is not UTF-8 text (byte {err.start}), which "
                           "labels files are.") from None
    if len(lines) != len(labels):
        raise EdgevitError(f"{labels_path.name} has {len(lines)} labels; the model's metadata has {len(labels)}: "
                           f"bundle ships only labels that agree with the file.")
    line = next((i for i, (a, b) in enumerate(zip(lines, labels)) if a != b), None)
    if line is not None:
        raise EdgevitError(f"{labels_path.name} line {line + 1} is {lines[line]!r} where the model's metadata says "
                           f"{labels[line]!r}: bundle ships only labels that agree with the file.")
    return labels


def validate_metadata(meta: dict, source: str) -> None:
    """The checks the app would otherwise fail on at run time, as one clear error."""
    def fail(why: str):
        raise EdgevitError(f"Unsupported model metadata ({source}): {why}.")

    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        fail(f"'schema' is not {SCHEMA!r}")
    if meta.get("schema_version") != SUPPORTED_SCHEMA_VERSION:
        fail(f"schema_version {meta.get('schema_version')!r}; this app reads version {SUPPORTED_SCHEMA_VERSION}")
    for key in ("input", "output"):
        tensor = meta.get(key) or {}
        if tensor.get("dtype") not in SUPPORTED_DTYPES:
            fail(f"{key} dtype {tensor.get('dtype')!r} (the app handles {', '.join(SUPPORTED_DTYPES)})")
        if tensor["dtype"] != "float32" and not tensor.get("quantization"):
            fail(f"{key} is {tensor['dtype']} but has no quantization parameters")
    shape = meta["input"].get("shape") or []
    if len(shape) != 4 or shape[0] != 1 or shape[3] != 3 or shape[1] != shape[2]:
        fail(f"input shape {shape} (the app feeds one square RGB image: [1, S, S, 3])")
    out_shape = meta["output"].get("shape") or []
    if task_of(meta) == DETECTION:
        out_shape = _detector_scores_shape(meta, fail)
    elif task_of(meta) == SEGMENTATION:
        if len(out_shape) != 4 or out_shape[0] != 1 or min(out_shape) < 1:
            fail(f"output shape {out_shape} (the app reads a segmenter's logits: [1, height, width, classes])")
    elif len(out_shape) != 2 or out_shape[0] != 1:
        fail(f"output shape {out_shape} (the app reads class scores: [1, classes])")
    labels, classes = meta.get("labels") or [], out_shape[-1]
    if len(labels) != classes:
        fail(f"{len(labels)} labels but the model outputs {classes} classes (the app shows one label a class)")
    pre = meta.get("preprocessing") or {}
    if pre.get("input_size") != shape[1]:
        fail(f"preprocessing.input_size {pre.get('input_size')} does not match the input shape {shape}")
    if pre.get("interpolation") not in ("bilinear", "bicubic"):
        fail(f"interpolation {pre.get('interpolation')!r} (the app resizes with bilinear or bicubic)")


def _detector_scores_shape(meta: dict, fail) -> list:
    """A detector's outputs as the app reads them, by form; the shape whose
    last axis the labels name (the raw form's scores; the NMS form's classes
    are the labels' lines)."""
    block = meta.get("detection") or {}
    outputs = [o for o in block.get("outputs") or [] if isinstance(o, dict)]
    shapes = [o.get("shape") for o in outputs]
    if block.get("form") == RAW_FORM:
        if len(shapes) != 2 or shapes[0] != meta["output"].get("shape") or len(shapes[0] or []) != 3 \
                or shapes[0][0] != 1 or shapes[0][2] != 4 or shapes[1] != [1, shapes[0][1], meta.get("num_classes")]:
            fail(f"detection outputs {shapes} (the app reads a raw detector's boxes [1, anchors, 4] and scores "
                 f"[1, anchors, {meta.get('num_classes')}])")
    elif block.get("form") == NMS_FORM:
        most = (shapes[0] or [0, 0])[1] if shapes and isinstance(shapes[0], list) and len(shapes[0]) == 3 else None
        if shapes != [[1, most, 4], [1, most], [1, most], [1]] or any(o.get("dtype") != "float32" for o in outputs):
            fail(f"detection outputs {shapes} (the app reads the post-processing op's boxes [1, N, 4], classes [1, N], "
                 "scores [1, N] and count [1], float32)")
    else:
        fail(f"detection.form {block.get('form')!r} (the app reads a detector's {RAW_FORM!r} or {NMS_FORM!r} form)")
    for i, said in enumerate(outputs):
        if said.get("dtype") not in SUPPORTED_DTYPES or (said["dtype"] != "float32" and not said.get("quantization")):
            fail(f"detection output {i} is {said.get('dtype')!r} without the quantization the app dequantizes with")
    return [1, meta.get("num_classes")]


def _check_anchors(content: bytes, meta: dict, source: str) -> None:
    """A raw detector's anchors, which the app reads from the file's
    standard metadata (DETECTOR_METADATA), one for each box."""
    block = meta["detection"]
    if block["form"] != RAW_FORM:
        return
    options = detector_options(read_standard(content) or {})
    anchors = len(anchors_of_options(options)) if options is not None else 0
    boxes = block["outputs"][0]["shape"][1]
    if anchors != boxes:
        raise EdgevitError(f"Unsupported model metadata ({source}): the file's standard metadata holds {anchors} "
                           f"anchors for {boxes} boxes (the app decodes the boxes against them).")


def bundle(model_path: str | Path, demo_dir: str | Path) -> dict:
    """Copy ``model_path`` with its metadata and labels into ``demo_dir``'s assets.

    Returns ``{"model": ..., "precision": ..., "assets": {"model": path, "metadata": path,
    "labels": path}, "build": [shell commands that build and install the app]}``.
    """
    model_path = Path(model_path)
    if model_path.suffix != ".tflite":
        raise EdgevitError(f"{str(model_path)!r} is not a .tflite file.")
    content = read_file(model_path)
    assets = check_demo_folder(demo_dir)
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise EdgevitError(f"{model_path.name} is not a LiteRT/TFLite flatbuffer (no TFL3 identifier).")

    meta, source = _load_metadata(model_path, content)
    validate_metadata(meta, source)
    if task_of(meta) == DETECTION:
        _check_anchors(content, meta, source)
    labels = _labels(_sidecars(model_path)[1], meta)

    targets = {"model": assets / MODEL_ASSET, "metadata": assets / METADATA_ASSET, "labels": assets / LABELS_ASSET}
    # The three files are replaced together, and only once every check passed.
    with staged(list(targets.values())) as staging:
        staging.write_bytes(targets["model"], content)
        staging.write_text(targets["metadata"], json.dumps(meta, indent=2) + "\n")
        staging.write_text(targets["labels"], "\n".join(labels) + "\n")
    return {"model": meta.get("model"), "precision": meta.get("precision"), "source": str(model_path),
            "assets": {k: str(v) for k, v in targets.items()}, "build": build_commands(demo_dir)}
