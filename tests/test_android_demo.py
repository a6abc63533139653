"""The Android demo (android_demo/) without an Android SDK: bundling, the
offline build checks (aapt2, kotlinc against API stubs, JUnit on the JVM) and
the golden test of the Kotlin preprocessing against edgevit's Python one.

Tests that need kotlinc / a JDK / aapt2 / JUnit skip with the missing tool's
name; `bash scripts/install-test-tools.sh` installs them all.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgevit.errors import EdgevitError
from edgevit.export import android_bundle
from edgevit.export.android_bundle import bundle
from edgevit.export.pipeline import ExportOptions, export
from edgevit.registry import ModelSpec, Preprocessing

DEMO = Path(__file__).resolve().parents[1] / "android_demo"
OFFLINE = DEMO / "offline-check"
APP_KOTLIN = DEMO / "app" / "src" / "main" / "java" / "org" / "edgevit" / "demo"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


offline = _load("edgevit_android_offline_check", OFFLINE / "offline_check.py")
golden = _load("edgevit_android_make_golden", OFFLINE / "make_golden.py")


# ---------------------------------------------------------------- bundling

SIZE = 32
SPEC = ModelSpec("tiny_convnet", "test", builder=None, default_input_size=SIZE,
                 preprocessing=Preprocessing(SIZE, 36, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))


def tiny_model(classes=10):
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=2)(inputs)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="tiny_convnet")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny int8 model written by the real export pipeline, with its sidecars."""
    out = tmp_path_factory.mktemp("export") / "tiny_int8.tflite"
    result = export(tiny_model(), SPEC, ExportOptions(precision="int8", output=str(out), calib_samples=8,
                                                      validation_samples=4))
    return result.files.model


SEGMENTER_SPEC = dataclasses.replace(SPEC, name="tiny_segmenter", task="segmentation")
SEGMENTER_CLASSES = 3


def tiny_segmenter():
    """Logits [1, SIZE / 4, SIZE / 4, classes]: a segmenter as the app sees one."""
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Conv2D(SEGMENTER_CLASSES, 3, strides=2, padding="same")(x),
                       name="tiny_segmenter")


@pytest.fixture(scope="module")
def segmenter_file(tmp_path_factory):
    """A tiny fully-int8 segmenter written by the real export pipeline (uint8 in, logits out)."""
    out = tmp_path_factory.mktemp("segmenter") / "seg_int8.tflite"
    result = export(tiny_segmenter(), SEGMENTER_SPEC, ExportOptions(
        precision="int8", output=str(out), calib_samples=8, validation_samples=4, gpu_images=0))
    return result.files.model


def fake_demo(root: Path) -> Path:
    """The parts of android_demo/ the bundler looks at (never the repository's own copy)."""
    demo = root / "android_demo"
    (demo / "app" / "src" / "main").mkdir(parents=True)
    (demo / android_bundle.WRAPPER_PROPERTIES).parent.mkdir(parents=True)
    for part in (android_bundle.DEMO_MARKER, Path("app") / "src" / "main" / "AndroidManifest.xml",
                 android_bundle.WRAPPER_PROPERTIES):
        shutil.copy(DEMO / part, demo / part)
    return demo


def kotlin_constant(name: str) -> str:
    text = (APP_KOTLIN / "ModelRunner.kt").read_text()
    return re.search(rf'const val {name} = "([^"]+)"', text).group(1)


def test_bundle_names_match_what_the_app_reads():
    assert kotlin_constant("MODEL_ASSET") == android_bundle.MODEL_ASSET
    assert kotlin_constant("METADATA_ASSET") == android_bundle.METADATA_ASSET
    assert kotlin_constant("LABELS_ASSET") == android_bundle.LABELS_ASSET
    assert (DEMO / android_bundle.ASSETS_DIR).is_dir()
    assert (DEMO / android_bundle.DEMO_MARKER).is_file()
    ignored = (DEMO / ".gitignore").read_text()
    for name in (android_bundle.MODEL_ASSET, android_bundle.METADATA_ASSET, android_bundle.LABELS_ASSET):
        assert f"/app/src/main/assets/{name}" in ignored


def test_bundle_puts_model_metadata_and_labels_where_the_app_reads_them(tmp_path, exported):
    demo = fake_demo(tmp_path)
    result = bundle(exported, demo)
    assets = demo / "app" / "src" / "main" / "assets"
    assert sorted(p.name for p in assets.iterdir()) == ["labels.txt", "model.json", "model.tflite"]
    assert (assets / "model.tflite").read_bytes() == exported.read_bytes()
    meta = json.loads((assets / "model.json").read_text())
    assert meta == json.loads(exported.with_suffix(".json").read_text())
    assert meta["input"]["dtype"] == "uint8" and meta["preprocessing"]["input_size"] == SIZE
    labels = (assets / "labels.txt").read_text().splitlines()
    assert labels == exported.with_name("tiny_int8.labels.txt").read_text().splitlines()
    assert len(labels) == meta["num_classes"] == 10
    assert result["assets"]["model"] == str(assets / "model.tflite")
    assert result["model"] == "tiny_convnet" and result["precision"] == "int8"


def test_bundle_falls_back_to_the_embedded_metadata(tmp_path, exported):
    lone = tmp_path / "lone.tflite"
    shutil.copy(exported, lone)  # no lone.json / lone.labels.txt next to it
    demo = fake_demo(tmp_path)
    bundle(lone, demo)
    assets = demo / android_bundle.ASSETS_DIR
    assert json.loads((assets / "model.json").read_text()) == json.loads(exported.with_suffix(".json").read_text())
    assert len((assets / "labels.txt").read_text().splitlines()) == 10


def test_rebundling_replaces_and_a_failed_bundle_keeps_the_previous_assets(tmp_path, exported):
    demo = fake_demo(tmp_path)
    bundle(exported, demo)
    assets = demo / android_bundle.ASSETS_DIR
    before = {p.name: p.read_bytes() for p in assets.iterdir()}
    broken = tmp_path / "broken.tflite"
    shutil.copy(exported, broken)
    broken.with_suffix(".json").write_text(exported.with_suffix(".json").read_text())
    (tmp_path / "broken.labels.txt").write_text("only\ntwo\n")
    with pytest.raises(EdgevitError, match="broken.labels.txt has 2 labels; the model's metadata has 10"):
        bundle(broken, demo)
    assert {p.name: p.read_bytes() for p in assets.iterdir()} == before
    bundle(exported, demo)  # again: replaced in place, no staging folder left behind
    assert sorted(p.name for p in assets.iterdir()) == ["labels.txt", "model.json", "model.tflite"]


def test_bundle_refuses_a_folder_that_is_not_the_demo(tmp_path, exported):
    with pytest.raises(EdgevitError, match="does not exist"):
        bundle(exported, tmp_path / "nowhere")
    (tmp_path / "other").mkdir()
    with pytest.raises(EdgevitError, match="is not an edgevit Android demo"):
        bundle(exported, tmp_path / "other")
    assert list((tmp_path / "other").iterdir()) == []


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.tflite", "does not exist"),
    (lambda d: _write(d / "m.bin", b"x"), "is not a .tflite file"),
    (lambda d: _write(d / "m.tflite", b"\0" * 64), "no TFL3 identifier"),
])
def test_bundle_refuses_what_is_not_a_model(tmp_path, make, message):
    with pytest.raises(EdgevitError, match=message):
        bundle(make(tmp_path), fake_demo(tmp_path))


@pytest.mark.parametrize("edit, message", [
    # what edgevit's own checks refuse (`edgevit check` lists it)
    (lambda m: m.update(schema="other"), "edgevit metadata's schema is \"other\" \\(text\\), not "
                                         "'edgevit-model-metadata'"),
    (lambda m: m["input"].update(dtype="int16"), "input.dtype is \"int16\" \\(text\\), not one of float32, int8, "
                                                 "uint8"),
    (lambda m: m["input"].update(quantization=None), "input.quantization is missing, not a positive scale"),
    (lambda m: m["input"].update(shape=[1, 3, 32, 32]), r"says the input is uint8 \[1, 3, 32, 32\]; the graph's is "
                                                        r"uint8 \[1, 32, 32, 3\]"),
    (lambda m: m["preprocessing"].update(interpolation="lanczos"), "interpolation is \"lanczos\" \\(text\\)"),
    # what only the app cannot use
    (lambda m: m.update(schema_version=2), "schema_version 2; this app reads version 1"),
    (lambda m: m["preprocessing"].update(interpolation="nearest"), "interpolation 'nearest' \\(the app resizes with "
                                                                    "bilinear or bicubic\\)"),
])
def test_bundle_checks_the_metadata_the_app_depends_on(tmp_path, exported, edit, message):
    from edgevit.litert.metadata import embed, read_embedded

    meta = read_embedded(exported.read_bytes())
    edit(meta)
    model = tmp_path / "edited.tflite"  # both entries say it; no sidecars
    model.write_bytes(embed(exported.read_bytes(), meta, meta["labels"]))
    with pytest.raises(EdgevitError, match=message):
        bundle(model, fake_demo(tmp_path))


def test_bundle_puts_a_segmenter_where_the_app_reads_it(tmp_path, segmenter_file):
    demo = fake_demo(tmp_path)
    bundle(segmenter_file, demo)
    assets = demo / android_bundle.ASSETS_DIR
    meta = json.loads((assets / "model.json").read_text())
    assert meta["task"] == "segmentation" and meta["input"]["dtype"] == "uint8"
    assert meta["output"]["shape"] == [1, SIZE // 4, SIZE // 4, SEGMENTER_CLASSES]
    assert len((assets / "labels.txt").read_text().splitlines()) == SEGMENTER_CLASSES
    assert (assets / "model.tflite").read_bytes() == segmenter_file.read_bytes()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["output"].update(shape=[1, 8, 24]), r"output shape \[1, 8, 24\] \(the app reads a segmenter's "
                                                     r"logits: \[1, height, width, classes\]\)"),
    (lambda m: m["output"].update(shape=[1, 0, 8, 3]), r"output shape \[1, 0, 8, 3\]"),
    (lambda m: m.update(labels=["a", "b"]), r"2 labels but the model outputs 3 classes \(the app shows one label a "
                                            r"class\)"),
])
def test_bundle_checks_a_segmenters_metadata(tmp_path, segmenter_file, edit, message):
    meta = json.loads(segmenter_file.with_suffix(".json").read_text())
    edit(meta)
    with pytest.raises(EdgevitError, match=message):
        android_bundle.validate_metadata(meta, "model.json")


def test_bundle_refuses_a_segmenter_file_whose_metadata_is_wrong_in_one_error_line(tmp_path, segmenter_file):
    from edgevit.cli import main
    from edgevit.litert.metadata import embed, read_embedded

    meta = read_embedded(segmenter_file.read_bytes())
    meta["labels"] = meta["labels"][:2]
    model = tmp_path / "edited.tflite"
    model.write_bytes(embed(segmenter_file.read_bytes(), meta, meta["labels"]))
    demo = fake_demo(tmp_path)
    result = CliRunner().invoke(main, ["bundle", str(model), "--android-demo", str(demo)])
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ")
    assert not any((demo / android_bundle.ASSETS_DIR).iterdir())


@pytest.fixture(scope="module")
def detector_files(tmp_path_factory):
    """{"raw": path, "nms": path}: a small fully-int8 SSD detector in both forms, written by the real export
    pipeline (the stand-in of tests/test_detection_export.py: 64 px, 128 anchors, three classes)."""
    from edgevit.export import detection
    from edgevit.registry import get_spec
    from tests import test_detection_export as standin

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(detection, "anchors_of", lambda model: standin._anchors())
    monkeypatch.setattr(detection, "box_scales", lambda: standin.SCALES)
    spec = dataclasses.replace(get_spec("mobilevit_v1_xxs"), name="ssd_standin", task="detection",
                               preprocessing=Preprocessing(standin.SIZE, standin.SIZE))
    model, out, made = standin._standin(), tmp_path_factory.mktemp("detector"), {}
    try:
        for form in ("raw", "nms"):
            made[form] = out / f"det_{form}.tflite"
            export(model, spec, ExportOptions(output=str(made[form]), calib_samples=4, validation_samples=2,
                                              gpu_images=0, add_postprocessing_op=form == "nms"))
    finally:
        monkeypatch.undo()
    return made


@pytest.fixture(scope="module")
def detector_file(detector_files):
    return detector_files["raw"]


@pytest.mark.parametrize("form, outputs", [("raw", [[1, 128, 4], [1, 128, 3]]),
                                           ("nms", [[1, 100, 4], [1, 100], [1, 100], [1]])])
def test_bundle_puts_a_detector_of_either_form_where_the_app_reads_it(tmp_path, detector_files, form, outputs):
    demo = fake_demo(tmp_path)
    bundle(detector_files[form], demo)
    assets = demo / android_bundle.ASSETS_DIR
    meta = json.loads((assets / "model.json").read_text())
    assert meta["task"] == "detection" and meta["detection"]["form"] == form
    assert [o["shape"] for o in meta["detection"]["outputs"]] == outputs
    assert (assets / "labels.txt").read_text().splitlines() == ["circle", "square", "star"]
    assert (assets / "model.tflite").read_bytes() == detector_files[form].read_bytes()


@pytest.mark.parametrize("form, edit, message", [
    ("raw", lambda m: m["detection"].update(form="boxes"), r"detection.form 'boxes' \(the app reads a detector's 'raw' "
                                                           r"or 'nms' form\)"),
    ("raw", lambda m: m["detection"]["outputs"][1].update(shape=[1, 128, 4]),
     r"detection outputs \[\[1, 128, 4\], \[1, 128, 4\]\] \(the app reads a raw detector's boxes \[1, anchors, 4\] "
     r"and scores \[1, anchors, 3\]\)"),
    ("raw", lambda m: m["detection"]["outputs"][1].update(quantization=None), r"detection output 1 is 'uint8' without"),
    ("nms", lambda m: m["detection"]["outputs"][3].update(dtype="int8"), r"the post-processing op's boxes \[1, N, 4\]"),
    ("nms", lambda m: m.update(labels=["a", "b"]), r"2 labels but the model outputs 3 classes"),
])
def test_bundle_checks_a_detectors_metadata(detector_files, form, edit, message):
    meta = json.loads(detector_files[form].with_suffix(".json").read_text())
    edit(meta)
    with pytest.raises(EdgevitError, match=message):
        android_bundle.validate_metadata(meta, "model.json")


def test_bundle_refuses_a_raw_detector_without_its_anchors_in_one_error_line(tmp_path, detector_file):
    """The app decodes a raw detector's boxes against the anchors in the file's standard metadata: a file
    stripped of it passes `edgevit check` (its edgevit metadata agrees with the graph) but not bundle."""
    from edgevit.cli import main
    from edgevit.litert.flatbuffer import read_model, write_model

    content = detector_file.read_bytes()
    model = read_model(content)
    model.metadata = [entry for entry in model.metadata if entry.name != b"TFLITE_METADATA"]
    stripped = _write(tmp_path / "stripped.tflite", write_model(model, len(content)))
    demo = fake_demo(tmp_path)
    result = CliRunner().invoke(main, ["bundle", str(stripped), "--android-demo", str(demo)])
    assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "holds 0 anchors for 128 boxes (the app decodes the boxes against them)" in result.stderr
    assert not any((demo / android_bundle.ASSETS_DIR).iterdir())


def test_bundle_ships_only_sidecars_that_say_what_the_file_says(tmp_path, exported):
    model = tmp_path / "m.tflite"
    shutil.copy(exported, model)
    meta = json.loads(exported.with_suffix(".json").read_text())
    model.with_suffix(".json").write_text(json.dumps({**meta, "precision": "fp32"}))
    with pytest.raises(EdgevitError, match=r"^m.json differs from the metadata embedded in m.tflite \(precision: "
                                           r"\"fp32\" where the file says \"int8\"\)"):
        bundle(model, fake_demo(tmp_path))


def test_cli_bundle_command(tmp_path, exported):
    from edgevit.cli import main

    demo = fake_demo(tmp_path)
    result = CliRunner().invoke(main, ["bundle", str(exported), "--android-demo", str(demo)])
    assert result.exit_code == 0, result.output
    assert "model.tflite" in result.stdout
    # the repository carries no gradlew: the commands printed make it first (android_demo/README.md)
    assert [line.strip() for line in result.stdout.splitlines()[-3:]] == [
        f"cd {demo}", "gradle wrapper --gradle-version 8.14.3", "./gradlew installDebug"]
    assert "gradle wrapper --gradle-version 8.14.3" in (DEMO / "README.md").read_text()
    (demo / "gradlew").write_text("#!/bin/sh\n")
    result = CliRunner().invoke(main, ["bundle", str(exported), "--android-demo", str(demo), "--json"])
    assert json.loads(result.stdout)["build"] == [f"cd {demo}", "./gradlew installDebug"]
    assert (demo / android_bundle.ASSETS_DIR / "model.tflite").is_file()
    result = CliRunner().invoke(main, ["bundle", str(exported), "--android-demo", str(tmp_path / "x")])
    assert result.exit_code == 1 and result.stderr.startswith("error: ") and "does not exist" in result.stderr


def test_cli_convert_with_android_demo(tmp_path, monkeypatch):
    from edgevit import saving
    from edgevit.cli import main

    monkeypatch.setattr(saving, "resolve_model", lambda *a, **k: (tiny_model(), SPEC))
    demo = fake_demo(tmp_path)
    out = tmp_path / "m.tflite"
    result = CliRunner().invoke(main, ["convert", "tiny_convnet", "--int8", "-o", str(out), "--calib-samples", "8",
                                       "--android-demo", str(demo), "--json", "--no-arm-run"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["android_demo"]["assets"]["model"] == str(demo / android_bundle.ASSETS_DIR / "model.tflite")
    assert (demo / android_bundle.ASSETS_DIR / "model.tflite").read_bytes() == out.read_bytes()


def test_cli_convert_checks_the_demo_folder_before_converting(tmp_path, monkeypatch):
    from edgevit import saving
    from edgevit.cli import main

    monkeypatch.setattr(saving, "resolve_model", lambda *a, **k: pytest.fail("converted before checking"))
    result = CliRunner().invoke(main, ["convert", "tiny_convnet", "--android-demo", str(tmp_path)])
    assert result.exit_code == 1 and "is not an edgevit Android demo" in result.stderr


# ---------------------------------------------------------------- golden cases

@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory):
    """The golden preprocessing cases, regenerated by edgevit's Python code now."""
    out = tmp_path_factory.mktemp("golden")
    golden.write_golden(out)
    return out


def test_committed_golden_cases_are_current(golden_dir):
    """The copy Android Studio's unit tests read must equal what Python computes today."""
    committed = DEMO / "app" / "src" / "test" / "resources" / "golden"
    fresh_names = sorted(p.name for p in golden_dir.iterdir())
    assert sorted(p.name for p in committed.iterdir()) == fresh_names
    for name in fresh_names:
        a, b = committed / name, golden_dir / name
        if name.endswith(".png"):  # compare pixels: PNG bytes depend on the zlib build
            assert np.array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b))), name
        elif name.endswith(".json"):
            ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
            ja.pop("edgevit_version", None), jb.pop("edgevit_version", None)
            assert ja == jb, name
        else:
            assert a.read_bytes() == b.read_bytes(), f"{name}: run python {OFFLINE / 'make_golden.py'}"


def test_golden_cases_cover_every_input_type_and_path(golden_dir):
    cases = (golden_dir / "cases.txt").read_text().split()
    assert {"downscale_bilinear", "upscale_bicubic", "half_rounding", "exact_size"} <= set(cases)
    for case in cases:
        for dtype in ("float32", "int8", "uint8"):
            meta = json.loads((golden_dir / f"{case}.{dtype}.json").read_text())
            size = meta["preprocessing"]["input_size"]
            data = (golden_dir / f"{case}.{dtype}.bin").read_bytes()
            assert len(data) == size * size * 3 * (4 if dtype == "float32" else 1)
            assert meta["input"]["dtype"] == dtype


def test_the_detector_frames_are_evals_resize_and_tell_it_from_pillows(golden_dir):
    """GoldenPreprocessingTest feeds these frames to the detection case's detector: Python resized them as
    `edgevit eval` resizes a detector's photo (MediaPipe's resize), not as Pillow would, and together they
    sample past every other pixel (a downscale beyond 2x) and exactly half-way between two 1/32 steps."""
    from edgevit.data.transforms import WARP_POSITION_BITS, mediapipe_resize

    size = json.loads((golden_dir / "detect.json").read_text())["preprocessing"]["input_size"]
    frames = (golden_dir / "detector_frames.txt").read_text().split()
    shapes = []
    for name in frames:
        photo = np.asarray(Image.open(golden_dir / f"{name}.png"))
        fed = np.frombuffer((golden_dir / f"{name}.detector.rgb").read_bytes(), np.uint8).reshape(size, size, 3)
        assert np.array_equal(fed, mediapipe_resize(photo, size)), name
        assert not np.array_equal(fed, np.asarray(Image.fromarray(photo).resize((size, size), Image.BILINEAR))), name
        shapes += photo.shape[:2]
    assert max(shapes) > 2 * size
    assert any((np.arange(size) * side * 2 ** (WARP_POSITION_BITS + 1) / size % 2 == 1).any() for side in shapes)


def test_the_detection_golden_case_suppresses_across_classes(golden_dir):
    """GoldenDetectionTest compares at box_coding's threshold and at the one the app shows from: the first
    keeps boxes of more than one class, with tied scores (the order of ties is part of what must match), and
    suppression across classes removed every box of a class some anchors score best (within one class the
    best box always stays); the second keeps some."""
    meta = json.loads((golden_dir / "detect.json").read_text())
    anchors = meta["detection"]["outputs"][0]["shape"][1]
    cases = json.loads((golden_dir / "detect.expected.json").read_text())["cases"]
    assert [case["confidence"] for case in cases] == list(golden.DETECTION_CONFIDENCES)
    everything, shown = cases
    assert len(set(everything["classes"])) > 1
    assert len(set(everything["scores"])) < len(everything["scores"])
    scores = np.frombuffer((golden_dir / "detect.scores.bin").read_bytes(), np.uint8).reshape(anchors, -1)
    q = meta["detection"]["outputs"][1]["quantization"]
    probabilities = (scores.astype(np.float32) - q["zero_point"]) * q["scale"]
    candidates = probabilities.max(1) > everything["confidence"]
    assert set(probabilities.argmax(1)[candidates].tolist()) - set(everything["classes"])
    assert len(everything["scores"]) < candidates.sum() and len(shown["scores"]) > 0


def test_the_apps_raw_detector_suppression_is_evals_default():
    """SsdPostprocessor's constants are those `edgevit eval` suppresses a raw file with by default."""
    from edgevit.evaluate import MEDIAPIPE_DETECTIONS, MEDIAPIPE_IOU
    from edgevit.models.box_coding import CONFIDENCE

    text = (APP_KOTLIN / "core" / "Detection.kt").read_text()
    found = {name: float(value) for name, value in re.findall(r"const val (\w+) = ([0-9.]+)f?\n", text)}
    assert (found["CONFIDENCE"], found["NMS_IOU"], found["DETECTIONS"]) == (CONFIDENCE, MEDIAPIPE_IOU,
                                                                            MEDIAPIPE_DETECTIONS)


# ---------------------------------------------------------------- offline build checks

@pytest.fixture(scope="module")
def tools():
    return offline.find_tools()


@pytest.fixture(scope="module")
def built(tmp_path_factory, tools):
    """aapt2 link, then kotlinc of the app and of the tests: once per session (kotlinc is slow)."""
    out = tmp_path_factory.mktemp("android-offline-check")
    res, app, tests = offline.build(tools, out)
    return {"out": out, "res": res, "app": app, "tests": tests}


def _require(step):
    if step.skipped:
        pytest.skip(step.skipped)
    assert step.ok, f"{step.name} failed:\n{step.output}"


def test_resources_and_manifest_link_with_aapt2(built):
    _require(built["res"])
    r_java = next((built["out"] / "res" / "gen").rglob("R.java")).read_text()
    used_ids = set(re.findall(r"R\.id\.(\w+)", (APP_KOTLIN / "MainActivity.kt").read_text()))
    assert used_ids and all(f"int {i}=" in r_java.replace(" = ", "=") for i in used_ids)
    assert "uses-native-library" in built["res"].output  # said what was left out of the API 29 link


def test_linking_catches_a_misspelled_attribute(tools, tmp_path, monkeypatch):
    why = tools.lacking("aapt2", "framework-res")
    if why:
        pytest.skip(why)
    res = tmp_path / "main"
    shutil.copytree(DEMO / "app" / "src" / "main", res, ignore=shutil.ignore_patterns("java", "assets"))
    layout = res / "res" / "layout" / "activity_main.xml"
    layout.write_text(layout.read_text().replace('android:scaleType="fitCenter"', 'android:scaleTipe="fitCenter"'))
    monkeypatch.setattr(offline, "MAIN_SRC", res)
    step = offline.link_resources(tools, tmp_path / "out")
    assert not step.ok and "scaleTipe" in step.output


def test_app_kotlin_sources_compile_against_the_api_stubs(built):
    _require(built["app"])
    classes = built["out"] / "res" / "app-classes" / "org" / "edgevit" / "demo"
    assert (classes / "MainActivity.class").is_file() and (classes / "ModelRunner.class").is_file()
    assert all((classes / f"{task}Task.class").is_file() for task in ("Classifier", "Segmenter", "Detector"))


@pytest.mark.parametrize("model", ["exported", "segmenter_file", "detector_file"])
def test_pure_kotlin_unit_tests_pass_on_the_jvm_with_python_golden_cases(built, tools, golden_dir, model, request,
                                                                         tmp_path):
    """All JUnit tests, with golden cases Python just computed and a model
    (classifier, segmenter, raw detector) the real exporter just wrote, bundled the way
    users bundle it."""
    _require(built["tests"])
    demo = fake_demo(tmp_path)
    bundle(request.getfixturevalue(model), demo)
    step = offline.run_tests(tools, built["out"], golden_dir, demo / android_bundle.ASSETS_DIR)
    assert step.ok, step.output
    run, failed = offline.junit_counts(step.output)
    assert failed == 0 and run == _junit_test_count(), step.output
    names = " ".join(offline.test_class_names())
    assert "GoldenPreprocessingTest" in names and "BundledAssetsTest" in names and "GpuCheckTest" in names
    assert "GoldenSegmentationTest" in names and "GoldenDetectionTest" in names


def _junit_test_count(test_class: str = "") -> int:
    """@Test methods in the JUnit sources (of ``test_class`` only, when given)."""
    return sum(path.read_text().count("@Test")
               for path in (DEMO / "app" / "src" / "test" / "java").rglob(f"{test_class or '*'}.kt"))


def test_the_gpu_check_is_unit_tested_for_every_case_the_issue_names():
    """Agreement, disagreement, zero vectors, NaN/Inf, int8 dequantization, a failing GPU
    delegate: each has its JUnit test (and the JVM run above runs them all)."""
    source = (DEMO / "app" / "src" / "test" / "java" / "org" / "edgevit" / "demo" / "core" / "GpuCheckTest.kt")
    tests = set(re.findall(r"@Test\s+fun (\w+)", source.read_text()))
    assert {"agreeingOutputsKeepTheGpuAndSaySoOnce", "disagreeingOutputsMoveTheModelToTheCpuWithAWarning",
            "zeroVectorsAgreeOnlyWithEachOther", "nanOrInfInTheGpuOutputIsDisagreement",
            "int8OutputsAreDequantizedBeforeComparing", "theVerdictIsRememberedPerModelFile",
            "aGpuDelegateThatFailsToInitialiseFallsBackToTheCpuWithTheReason"} <= tests
    assert _junit_test_count("GpuCheckTest") == len(tests) >= 10


# ---------------------------------------------------------------- the stubs stay small

# Members a stub must declare although the app never names them.
STUB_MEMBERS_NOT_CALLED = {
    "onClick": "the single method that makes View.OnClickListener a lambda target",
    "getNativeHandle": "abstract in org.tensorflow.lite.Delegate; the delegates implement it",
    "onActivityResult": "the single method of the ActivityResultCallback fun interface",
    "charAt": "CharSequence's, which SpannableStringBuilder implements",
    "subSequence": "CharSequence's, which SpannableStringBuilder implements",
}


def _stub_members() -> dict[str, Path]:
    members = {}
    for path in (OFFLINE / "stubs").rglob("*.java"):
        # An enum stub lists the real enum's constants: not members to check.
        text = re.sub(r"\benum\s+\w+\s*\{[^}]*\}", "", path.read_text())
        for m in re.finditer(r"^\s+(?:public|protected|static|final|abstract|default|@Override|\s)*"
                             r"[\w.<>\[\], ?]+\s+(\w+)\s*\(", text, re.M):
            if not m.group(1)[0].isupper():  # constructors
                members.setdefault(m.group(1), path)
        for m in re.finditer(r"^\s+public\s+(?:static\s+)?(?:final\s+)?[\w.]+\s+(\w+)\s*[=;]", text, re.M):
            members.setdefault(m.group(1), path)
    for path in (OFFLINE / "stubs").rglob("*.kt"):
        for m in re.finditer(r"\bfun\s+(?:<[^>]+>\s+)?(\w+)\s*\(", path.read_text()):
            members.setdefault(m.group(1), path)
    return members


def test_stubs_declare_only_what_the_app_uses():
    app = "\n".join(p.read_text() for p in APP_KOTLIN.glob("*.kt"))
    words = set(re.findall(r"\w+", app))
    members = _stub_members()
    assert len(members) > 40
    unused = []
    for name, path in sorted(members.items()):
        # Kotlin calls Java getters/setters as properties: getText/setText -> text, setEnabled -> isEnabled.
        prop = re.sub(r"^(get|set)([A-Z])", lambda m: m.group(2).lower(), name)
        candidates = {name, prop, "is" + prop[:1].upper() + prop[1:]}
        if candidates & words or name in STUB_MEMBERS_NOT_CALLED:
            continue
        unused.append(f"{name} ({path.relative_to(OFFLINE)})")
    assert not unused, "stub members the app does not use: " + ", ".join(unused)
