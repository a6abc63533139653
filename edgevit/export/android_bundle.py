"""Put an exported model into the Android demo app (``android_demo/``).

The app reads three assets under fixed names, so any edgevit model works
without code changes:

- ``app/src/main/assets/model.tflite``: the model,
- ``app/src/main/assets/model.json``: its metadata (docs/model-metadata.md),
- ``app/src/main/assets/labels.txt``: one label per line.

The three files are written to a staging folder next to them and moved into
place together only after every check passed, so a failed bundle leaves the
app's previous assets untouched.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from edgevit.errors import EdgevitError, about, cause
from edgevit.litert.metadata import SCHEMA, read_embedded
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
        raise EdgevitError(f"Android demo folder {str(demo)!r} does not exist "
                           "(pass the android_demo/ folder of the edgevit repository).")
    if not demo.is_dir():
        raise EdgevitError(f"{str(demo)!r} is not a folder (pass the android_demo/ folder).")
    if not (demo / DEMO_MARKER).is_file() or not (demo / "app" / "src" / "main" / "AndroidManifest.xml").is_file():
        raise EdgevitError(f"{str(demo)!r} is not an edgevit Android demo (no {DEMO_MARKER} file and "
                           "app/src/main/AndroidManifest.xml): pass the android_demo/ folder of the "
                           "edgevit repository, or a copy of it.")
    assets = demo / ASSETS_DIR
    check_folder_writable(assets, "Assets folder")
    try:
        assets.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdgevitError(f"Could not make the assets folder {str(assets)!r}: {cause(err)}.") from None
    return assets


def build_commands(demo_dir: str | Path) -> list[str]:
    """The shell commands that build the app and install it on the phone
    adb sees, from the current folder (android_demo/README.md)."""
    demo = Path(demo_dir)
    commands = [f"cd {shlex.quote(str(demo))}"]
    if not (demo / "gradlew").is_file():
        match = re.search(r"gradle-([0-9.]+)-", (demo / WRAPPER_PROPERTIES).read_text(encoding="utf-8")) \
            if (demo / WRAPPER_PROPERTIES).is_file() else None
        commands.append("gradle wrapper" + (f" --gradle-version {match.group(1)}" if match else ""))
    return commands + ["./gradlew installDebug"]


def _sidecars(model_path: Path) -> tuple[Path, Path]:
    stem = model_path.with_suffix("")
    return stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".labels.txt")


def _load_metadata(model_path: Path, content: bytes) -> tuple[dict, str]:
    from edgevit.litert.metadata_check import check_metadata

    with about(model_path):
        check_metadata(content, model_path.name)
    meta_path, _ = _sidecars(model_path)
    if meta_path.is_file():
        try:
            document = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            reason = "it nests too deeply" if isinstance(err, RecursionError) else err
            raise EdgevitError(f"Metadata file {str(meta_path)!r} is not valid JSON: {reason}") from None
        if not isinstance(document, dict):
            raise EdgevitError(f"Metadata file {str(meta_path)!r} is a JSON {type(document).__name__}, not the object "
                               "`edgevit convert` writes.")
        return document, f"{meta_path.name}"
    try:
        embedded = read_embedded(content)
    except EdgevitError as err:
        raise EdgevitError(f"Could not read {model_path.name}: {err}") from None
    if embedded is None:
        raise EdgevitError(f"{model_path.name} has no edgevit metadata (no {meta_path.name} next to it and "
                           "none embedded): convert it with `edgevit convert` first.")
    return embedded, "metadata embedded in the model"


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
    if len(out_shape) != 2 or out_shape[0] != 1:
        fail(f"output shape {out_shape} (the app reads class scores: [1, classes])")
    pre = meta.get("preprocessing") or {}
    if pre.get("input_size") != shape[1]:
        fail(f"preprocessing.input_size {pre.get('input_size')} does not match the input shape {shape}")
    if pre.get("interpolation") not in ("bilinear", "bicubic"):
        fail(f"interpolation {pre.get('interpolation')!r} (the app resizes with bilinear or bicubic)")


def bundle(model_path: str | Path, demo_dir: str | Path) -> dict:
    """Copy ``model_path`` with its metadata and labels into ``demo_dir``'s assets.

    Returns ``{"model": ..., "precision": ..., "assets": {"model": path, "metadata": path,
    "labels": path}, "build": [shell commands that build and install the app]}``.
    """
    model_path = Path(model_path)
    if not model_path.is_file():
        raise EdgevitError(f"Model file {str(model_path)!r} does not exist.")
    if model_path.suffix != ".tflite":
        raise EdgevitError(f"{str(model_path)!r} is not a .tflite file.")
    assets = check_demo_folder(demo_dir)
    content = model_path.read_bytes()
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise EdgevitError(f"{model_path.name} is not a LiteRT/TFLite flatbuffer (no TFL3 identifier).")

    meta, source = _load_metadata(model_path, content)
    validate_metadata(meta, source)
    _, labels_path = _sidecars(model_path)
    if labels_path.is_file():
        labels = labels_path.read_text(encoding="utf-8").splitlines()
    else:
        labels = [str(label) for label in meta.get("labels") or []]
    classes = meta["output"]["shape"][1]
    if len(labels) != classes:
        raise EdgevitError(f"{labels_path.name if labels_path.is_file() else 'The metadata'} has "
                           f"{len(labels)} labels but the model outputs {classes} classes.")

    targets = {"model": assets / MODEL_ASSET, "metadata": assets / METADATA_ASSET, "labels": assets / LABELS_ASSET}
    # The three files are replaced together, and only once every check passed.
    with staged(list(targets.values())) as staging:
        staging.write_bytes(targets["model"], content)
        staging.write_text(targets["metadata"], json.dumps(meta, indent=2) + "\n")
        staging.write_text(targets["labels"], "\n".join(labels) + "\n")
    return {"model": meta.get("model"), "precision": meta.get("precision"), "source": str(model_path),
            "assets": {k: str(v) for k, v in targets.items()}, "build": build_commands(demo_dir)}
