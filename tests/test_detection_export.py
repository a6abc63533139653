"""A detector from Keras to the phone: `edgevit convert` writes a fully-int8
SSD file in MediaPipe's two forms. The raw one (boxes and softmax scores,
uint8, the anchors and box decoding in the metadata) loads in MediaPipe
Tasks' ObjectDetector as it is; with the detection post-processing op it
outputs the four float32 tensors MediaPipe and the Task Library read, the op
on the CPU. A stand-in with the contract's two outputs (edgevit.models.ssdlite),
its anchors made here: 64 px, one 8x8 level of two anchors, three classes
and the background."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from edgevit.evaluate import MEDIAPIPE_IOU, WITHOUT_BACKGROUND, declared_scores
from edgevit.export import detection
from edgevit.export.pipeline import ExportOptions, export
from edgevit.litert.detection_postprocess import ON_THE_CPU, POSTPROCESS_OP, Suppression, raw_view, \
    with_postprocess
from edgevit.litert.inputs import file_inputs, inputs_for_file
from edgevit.litert.metadata import read_embedded
from edgevit.litert.metadata_check import metadata_problems
from edgevit.litert.run_model import run_in_process, split_outputs
from edgevit.litert.standard_metadata import DETECTOR_IDENTIFIER, DETECTOR_METADATA, read_standard
from edgevit.registry import Preprocessing, get_spec
from edgevit.saving import set_class_names
from tests.standard_clients import detect, missing

SIZE, GRID, PER_PLACE = 64, 8, 2
CLASSES = ["background", "circle", "square", "star"]
SCALES = (10.0, 10.0, 5.0, 5.0)


def _anchors() -> np.ndarray:
    centres = (np.arange(GRID) + 0.5) / GRID
    y, x = (a.ravel() for a in np.meshgrid(centres, centres, indexing="ij"))
    shapes = [(0.25, 0.25), (0.35, 0.18)]  # (height, width) of each anchor at a place
    return np.stack([np.stack([y, x, np.full_like(y, h), np.full_like(y, w)], 1) for h, w in shapes],
                    1).reshape(-1, 4).astype(np.float32)


def _standin():
    """Boxes [1, A, 4] and class logits [1, A, 4], named as the contract names them; the score head's
    weights large enough that the scores spread over the int8 grid: equal scores leave the order of
    suppression to each implementation's sort."""
    import keras

    keras.utils.set_random_seed(0)
    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(image)
    x = keras.layers.Conv2D(24, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    boxes = keras.layers.Conv2D(PER_PLACE * 4, 1)(x)
    logits = keras.layers.Conv2D(PER_PLACE * len(CLASSES), 1,
                                 kernel_initializer=keras.initializers.RandomNormal(stddev=3.0))(x)
    model = keras.Model(image, [keras.layers.Reshape((GRID * GRID * PER_PLACE, 4), name="boxes")(boxes),
                                keras.layers.Reshape((GRID * GRID * PER_PLACE, len(CLASSES)), name="scores")(logits)])
    set_class_names(model, CLASSES)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{"raw": (path, result), "nms": (path, result)}: one model in both forms."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(detection, "anchors_of", lambda model: _anchors())
    monkeypatch.setattr(detection, "box_scales", lambda: SCALES)
    # bicubic as ssdlite_mobilevit_v2's recipe: the metadata states MediaPipe's bilinear resize all the same
    spec = dataclasses.replace(get_spec("mobilevit_v1_xxs"), name="ssd_standin", task="detection",
                               preprocessing=Preprocessing(SIZE, SIZE, "bicubic"))
    model, out, made = _standin(), tmp_path_factory.mktemp("det"), {}
    for form in ("raw", "nms"):
        path = out / f"det_{form}.tflite"
        opts = ExportOptions(output=str(path), calib_samples=8, validation_samples=8, gpu_images=0,
                             add_postprocessing_op=form == "nms")
        made[form] = path, export(model, spec, opts)
    monkeypatch.undo()
    return made


def _pixels(count: int = 6) -> np.ndarray:
    from edgevit.data import sample_photos

    photos = sample_photos.sample_batch(Preprocessing(SIZE, SIZE), count, held_out=True, task="detection")
    return np.clip(np.round(photos * 255), 0, 255).astype(np.uint8)


def _litert(content: bytes, pixels: np.ndarray) -> list[np.ndarray]:
    """Each output of the file for the bytes (its uint8 input's scale is 1/255)."""
    return split_outputs(content, run_in_process(content, pixels.astype(np.float32) / 255.0))




def test_raw_form_is_all_integer_and_its_metadata_is_what_mediapipe_reads(files):
    path, result = files["raw"]
    report = result.to_dict()
    outputs = report["io"]["outputs"]
    anchors = GRID * GRID * PER_PLACE
    assert [(o["shape"], o["dtype"]) for o in outputs] == [([1, anchors, 4], "uint8"), ([1, anchors, 3], "uint8")]
    assert outputs[1]["quantization"] == {"scale": 1 / 256, "zero_point": 0}  # the softmax's grid, kept exactly
    assert report["io"]["input"]["dtype"] == "uint8"
    assert all(c["passed"] for c in report["checks"]) and "SOFTMAX" in report["op_histogram"]
    for delegate in ("gpu", "nnapi"):
        assert report["delegates"][delegate]["fallback_ops"] == 0, report["delegates"][delegate]
    a = report["agreement"]
    assert a["samples"] == 8 and a["anchors"] == anchors and a["cosine_mean"] > 0.99 and a["box_cosine_mean"] > 0.99
    assert a["detections"][0] > 0 and a["detections_same"] >= 0.75  # the confident detections, after suppression

    content = path.read_bytes()
    assert metadata_problems(content) == []
    meta = read_embedded(content)
    assert meta["task"] == "detection" and meta["labels"] == CLASSES[1:] and meta["output"]["kind"] == "box_encodings"
    assert meta["detection"]["form"] == "raw" and meta["detection"]["box_scales"] == list(SCALES)
    assert meta["preprocessing"]["interpolation"] == "bilinear"
    standard = read_standard(content)
    assert f"{SIZE}x{SIZE} input (bilinear resize of the whole image)" in standard["description"]
    location, score = standard["subgraph_metadata"][0]["output_tensor_metadata"]
    assert location["name"] == "location" and location["content"]["content_properties"][1] == {
        "index": [1, 0, 3, 2], "type": 1}  # BOUNDARIES; coordinate_type RATIO is the default, 0
    assert score["name"] == "score" and standard["files"]["labels.txt"].decode().splitlines() == CLASSES[1:]
    custom = standard["subgraph_metadata"][0]["custom_metadata"][0]
    assert custom["name"] == DETECTOR_METADATA and custom["data"][4:8] == DETECTOR_IDENTIFIER


def test_a_detector_file_is_checked_on_sample_photos_resized_as_mediapipe_does(files):
    """The GPU and Arm64 runs' inputs: held-out views of the photos' whole
    frame (their aspect kept) through MediaPipe's resize, as bytes."""
    from edgevit.data import sample_photos

    content = files["raw"][0].read_bytes()
    inputs, _ = inputs_for_file(content, 2)
    photos = sample_photos.sample_batch(Preprocessing(SIZE, SIZE), 2, held_out=True, task="detection")
    np.testing.assert_array_equal(inputs, file_inputs(content, photos))


def test_nms_form_ends_in_the_postprocessing_op_on_the_cpu(files):
    path, result = files["nms"]
    report = result.to_dict()
    assert [(o["name"], o["shape"], o["dtype"]) for o in report["io"]["outputs"]] == [
        ("location", [1, 100, 4], "float32"), ("category", [1, 100], "float32"), ("score", [1, 100], "float32"),
        ("number of detections", [1], "float32")]
    assert report["op_histogram"][POSTPROCESS_OP] == 1 and report["op_histogram"]["DEQUANTIZE"] == 1
    integer = next(c for c in report["checks"] if c["check"].startswith("every op integer"))
    assert integer["passed"] and POSTPROCESS_OP in integer["detail"]
    for delegate in ("gpu", "nnapi"):
        fallbacks = report["delegates"][delegate]["fallbacks"]
        assert [(f["op"], f["reason"]) for f in fallbacks] == [(POSTPROCESS_OP, ON_THE_CPU)]
    assert any(place.startswith("GPU delegate") for place in report["verdict"]["deployable_on"])
    assert report["agreement"]["cosine_mean"] > 0.99  # the raw outputs the op reads
    content = path.read_bytes()
    assert metadata_problems(content) == []
    names = [t["name"] for t in read_standard(content)["subgraph_metadata"][0]["output_tensor_metadata"]]
    assert names == ["location", "category", "score", "number of detections"]


def test_the_postprocessing_op_reads_the_raw_outputs_of_the_same_graph(files):
    raw, nms = (files[form][0].read_bytes() for form in ("raw", "nms"))
    pixels = _pixels(3)
    for mine, theirs in zip(_litert(raw, pixels), _litert(raw_view(nms), pixels)):
        np.testing.assert_array_equal(mine, theirs)


def _eval_detections(content: bytes, pixels: np.ndarray) -> list[tuple]:
    """Per image, (boxes, scores, classes counted from 0) as `edgevit eval` (its default --nms) suppresses the
    file's detections: a post-processing-op file read before its op."""
    from edgevit.evaluate import MEDIAPIPE_NMS, detection_postprocessing
    from edgevit.models.box_coding import decode

    suppress, _ = detection_postprocessing(MEDIAPIPE_NMS, read_embedded(content))
    regressions, scores = _litert(raw_view(content), pixels)
    found = []
    for image_regressions, image_scores in zip(regressions, scores):
        boxes, kept, classes = suppress(decode(image_regressions, _anchors()),
                                        np.concatenate([np.zeros_like(image_scores[:, :1]), image_scores], 1))
        found.append((boxes, kept, classes - 1))
    return found


def _shown(detections, boxes, classes, scores) -> bool:
    """Whether each of MediaPipe's ``detections`` of an image is one of these, in class, score and box."""
    for _, name, score, *box in detections:
        near = np.abs(scores - score) < 1e-6
        near &= np.array([CLASSES[1 + int(c)] == name for c in classes])
        near &= np.abs(_as_mediapipe_box(boxes) - box).max(axis=1) <= 1.5 / SIZE
        if not near.any():
            return False
    return True


def test_mediapipe_detects_with_the_raw_form_what_the_postprocessing_op_and_eval_find(files, tmp_path):
    """MediaPipe decodes the raw outputs with the metadata's anchors and scales and suppresses overlaps; the
    detection post-processing op, given the same outputs, anchors and MediaPipe's IoU threshold, and `edgevit
    eval`'s suppression of the same outputs keep as many boxes, each of the same class, score and box."""
    if missing("mediapipe"):
        pytest.skip(missing("mediapipe"))
    path, _ = files["raw"]
    pixels = _pixels()
    found = detect("mediapipe", path, pixels, tmp_path)
    assert not isinstance(found, str), found
    reference = with_postprocess(path.read_bytes(), _anchors(), SCALES,
                                 Suppression(max_detections=GRID * GRID * PER_PLACE, iou_threshold=MEDIAPIPE_IOU,
                                             score_threshold=0.0))
    boxes, classes, scores, counts = _litert(reference, pixels)
    evaluated = _eval_detections(path.read_bytes(), pixels)
    for image, detections in enumerate(found):
        kept = int(counts[image])
        assert len(detections) == kept == len(evaluated[image][1]) > 0
        assert _shown(detections, boxes[image, :kept], classes[image, :kept], scores[image, :kept])
        eval_boxes, eval_scores, eval_classes = evaluated[image]
        assert _shown(detections, eval_boxes, eval_classes, eval_scores)


def test_both_forms_declare_the_scores_eval_reads(files):
    """Each form's metadata says its scores leave the background out: eval reads them so, not by their values."""
    for path, _ in files.values():
        assert declared_scores(read_embedded(path.read_bytes())) == WITHOUT_BACKGROUND


def test_eval_suppresses_the_nms_form_as_its_op_does(files):
    """`edgevit eval` reads a post-processing-op file before its op and applies the op's options (from the
    metadata): the op's own detections, in its order."""
    content = files["nms"][0].read_bytes()
    pixels = _pixels()
    boxes, classes, scores, counts = _litert(content, pixels)
    for image, (kept_boxes, kept_scores, kept_classes) in enumerate(_eval_detections(content, pixels)):
        kept = int(counts[image])
        assert len(kept_scores) == kept > 0
        np.testing.assert_array_equal(kept_classes, classes[image, :kept])
        np.testing.assert_allclose(kept_scores, scores[image, :kept], atol=1e-6)
        np.testing.assert_allclose(kept_boxes, boxes[image, :kept], atol=1e-5)



def _as_mediapipe_box(boxes: np.ndarray) -> np.ndarray:
    """(ymin, xmin, ymax, xmax) as MediaPipe reports them: the origin clipped to the image and moved down to
    a whole pixel, the size kept, in whole pixels."""
    origin = np.floor(np.clip(boxes[:, :2], 0, None) * SIZE)
    size = np.floor((boxes[:, 2:] - boxes[:, :2]) * SIZE)
    return np.concatenate([origin, origin + size], axis=1) / SIZE


@pytest.mark.parametrize("client", ["mediapipe", "task_library"])
def test_clients_load_the_nms_form_and_show_what_litert_computes(files, tmp_path, client):
    if missing(client):
        pytest.skip(missing(client))
    path, _ = files["nms"]
    pixels = _pixels()
    found = detect(client, path, pixels, tmp_path)
    assert not isinstance(found, str), found
    boxes, classes, scores, counts = _litert(path.read_bytes(), pixels)
    for image, detections in enumerate(found):
        shown = _as_mediapipe_box(boxes[image, :int(counts[image])])
        kept = np.arange(len(shown))
        if client == "mediapipe":  # it shows the best of the detections of one pixel box (64 px boxes meet often)
            kept = np.sort(np.unique(shown.round(6), axis=0, return_index=True)[1])
        assert len(detections) == len(kept)
        assert [name for _, name, *_ in detections] == [CLASSES[1 + int(c)] for c in classes[image, kept]]
        np.testing.assert_allclose([score for _, _, score, *_ in detections], scores[image, kept], atol=1e-6)
        expected = shown if client == "mediapipe" else boxes[image]  # the Task Library clips no box
        np.testing.assert_allclose([box for _, _, _, *box in detections], expected[kept], atol=1.5 / SIZE)


@pytest.mark.parametrize("form", ["raw", "nms"])
def test_check_and_bench_read_the_detector(files, form):
    from click.testing import CliRunner

    from edgevit.cli import main

    path, _ = files[form]
    result = CliRunner().invoke(main, ["check", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    checked = json.loads(result.stdout)
    assert checked["metadata"]["problems"] == [] and checked["metadata"]["edgevit"]["task"] == "detection"
    gpu = [(f["op"], f["reason"]) for f in checked["gpu"]["fallback_summary"]]
    assert gpu == ([(POSTPROCESS_OP, ON_THE_CPU)] if form == "nms" else [])
    result = CliRunner().invoke(main, ["bench", str(path), "--threads", "1", "--host-kernels", "xnnpack", "--runs",
                                       "2", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.stderr


def test_the_report_table_shows_a_detectors_agreement(files):
    import io

    from edgevit.export.report import print_report

    out = io.StringIO()
    print_report(files["raw"][1], stream=out)
    table = out.getvalue()
    assert "anchors' top class" in table and "same detections" in table and "verdict:" in table


def test_float_io_int8_detector_passes_the_audit_with_a_dequantize_per_output():
    """--int8 --io float32: each of the two outputs ends in the DEQUANTIZE
    of the boundary (issue 55: the second one was taken for a float op
    inside the graph, and the conversion refused)."""
    from edgevit.data import sample_photos
    from edgevit.errors import EdgevitError
    from edgevit.export.audit import audit
    from edgevit.export.convert import convert
    from edgevit.litert.flatbuffer import read

    calibration = sample_photos.sample_batch(Preprocessing(SIZE, SIZE), 4)
    content = convert(_standin(), "int8", calibration, io_dtype="float32")
    graph = read(content)
    assert [graph.ops[graph.producers[index]].name for index in graph.outputs] == ["DEQUANTIZE"] * 2
    checks = audit(content, "int8", "float32").checks
    assert all(c.passed for c in checks) and any(c.name.startswith("every op integer") for c in checks)
    with pytest.raises(EdgevitError, match=r"float ops in the graph \(QUANTIZE#0, DEQUANTIZE#\d+, DEQUANTIZE#\d+\)"):
        audit(content, "int8", "int8")  # the same file held to integer io: its boundary ops are float ops


def test_the_postprocessing_op_on_a_classifier_is_one_error_and_no_file(tmp_path):
    import keras

    from edgevit.errors import EdgevitError

    image = keras.Input((SIZE, SIZE, 3))
    model = keras.Model(image, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(image)))
    opts = ExportOptions(output=str(tmp_path / "c.tflite"), add_postprocessing_op=True, gpu_images=0)
    with pytest.raises(EdgevitError, match="--add-postprocessing-op: mobilevit_v1_xxs is a classification model"):
        export(model, get_spec("mobilevit_v1_xxs"), opts)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_ssdlite_mobilevit_v1_xs_from_the_command_line_in_both_forms(tmp_path, monkeypatch):
    """The real detector (random weights, 64 px: 142 anchors) through `edgevit convert` in both forms: every
    check passes, the metadata contradicts nothing, MediaPipe loads both and the Task Library the NMS form."""
    from click.testing import CliRunner

    from edgevit.cli import main

    monkeypatch.chdir(tmp_path)
    pixels = _pixels(4)
    for flags in ([], ["--add-postprocessing-op"]):
        out = tmp_path / f"det{len(flags)}.tflite"
        result = CliRunner().invoke(main, ["convert", "--int8", "ssdlite_mobilevit_v1_xs", "--input-size", "64",
                                           "--calib-samples", "8", "--no-gpu-run", "--no-arm-run", "--json", "-o",
                                           str(out), *flags])
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert all(c["passed"] for c in report["checks"]) and report["agreement"]["anchors"] == 142
        assert metadata_problems(out.read_bytes()) == []
        clients = ["mediapipe", "task_library"] if flags else ["mediapipe"]
        for client in clients:
            if missing(client):
                continue
            found = detect(client, out, np.stack([np.asarray(p) for p in pixels]), tmp_path)
            assert not isinstance(found, str), found
            assert all(name in read_embedded(out.read_bytes())["labels"] for image in found for _, name, *_ in image)
