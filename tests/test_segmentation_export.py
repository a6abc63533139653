"""A segmenter from Keras to the phone: `edgevit convert` writes a fully-int8
DeepLabV3 file whose standard metadata MediaPipe Tasks' ImageSegmenter
loads as it is (labels, normalisation, softmax), validated per pixel;
`edgevit eval` scores a .keras segmenter and its file alike (mIoU). A small
model (deeplabv3_mobilevit_v1_xxs at 64 px, random weights, BatchNorm
statistics and int8 ranges from the synthetic shapes images)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import edgevit
from edgevit.cli import main
from edgevit.data.masks import find_segmentation_dataset
from edgevit.data.stream import ImageStream
from edgevit.evaluate import evaluate
from edgevit.export.pipeline import ExportOptions, export
from edgevit.data.transforms import normalise
from edgevit.litert.inputs import file_inputs
from edgevit.litert.metadata import read_embedded
from edgevit.litert.metadata_check import metadata_problems
from edgevit.litert.run_model import run_in_process
from edgevit.litert.standard_metadata import ACTIVATION_NONE, ACTIVATION_SOFTMAX, populate, read_standard, \
    segmenter_activation, serialize
from edgevit.registry import get_spec
from edgevit.saving import save_model, set_class_names
from edgevit.train.metrics import SegmentationTally, upsampled_classes
from tests.standard_clients import missing, segment
from tests.test_segmentation_data import make_segmentation_folder

NAME, SIZE, CLASSES = "deeplabv3_mobilevit_v1_xxs", 64, ["background", "square"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_segmentation_folder(tmp_path_factory.mktemp("seg") / "shapes", classes=tuple(CLASSES), per_split=12,
                                    size=(80, 64))


def _export(model, folder, out, precision, recalibrate=True):
    opts = ExportOptions(precision=precision, output=str(out), calib_dir=str(folder / "train" / "images"),
                         calib_samples=4, validation_samples=8, gpu_images=0, recalibrate_batchnorm=recalibrate)
    return export(model, get_spec(NAME), opts)


@pytest.fixture(scope="module")
def segmenter(shapes, tmp_path_factory):
    """(the Keras model saved as .keras, its int8 file, the file's report, its fp32 file)."""
    import keras

    keras.utils.set_random_seed(0)
    model = edgevit.create_model(NAME, num_classes=len(CLASSES), input_size=SIZE)
    set_class_names(model, CLASSES)
    out = tmp_path_factory.mktemp("int8")
    result = _export(model, shapes, out / "seg_int8.tflite", "int8")
    save_model(model, out / "seg.keras")  # with the BatchNorm statistics the file was made from
    _export(model, shapes, out / "seg_fp32.tflite", "fp32", recalibrate=False)
    return out / "seg.keras", out / "seg_int8.tflite", result.to_dict(), out / "seg_fp32.tflite"


def _segment(model, pixels, tmp, client="mediapipe"):
    """The client's category masks, confidence masks and labels of ``pixels`` (uint8 crops)."""
    result = segment(client, model, pixels, tmp)
    assert not isinstance(result, str), f"{client} refused {model.name}: {result}"
    return result["category"], result["confidence"], result["labels"]


def _val_crops(folder, pre):
    """The val images as the evaluation transform crops them (uint8) with their masks."""
    stream = ImageStream(find_segmentation_dataset(folder).val, pre)
    pixels, masks, real = (np.asarray(t) for t in next(iter(stream.evaluation_dataset(SIZE, 32))))
    return pixels[real], masks[real]


def test_int8_segmenter_is_all_integer_and_its_metadata_says_what_mediapipe_needs(segmenter):
    _, path, report, _ = segmenter
    assert report["io"]["input"]["dtype"] == "uint8" and report["io"]["output"]["dtype"] == "uint8"
    assert report["io"]["output"]["shape"] == [1, SIZE // 16, SIZE // 16, len(CLASSES)]
    checks = {c["check"]: c["passed"] for c in report["checks"]}
    assert all(checks.values()) and any(name.startswith("every op integer") for name in checks)
    assert "SOFTMAX" in report["op_histogram"] and report["op_histogram"]["RESIZE_BILINEAR"] == 1  # ASPP pooling
    for delegate in ("gpu", "nnapi"):  # the resize is one both take
        assert report["delegates"][delegate]["fallback_ops"] == 0, report["delegates"][delegate]
    a = report["agreement"]  # per pixel: argmax agreement and the cosine of each pixel's logits
    assert a["samples"] == 8 and a["pixels"] == 8 * (SIZE // 16) ** 2
    assert 0 <= a["top1_agreement"] <= 1 and -1 <= a["cosine_min"] <= a["cosine_mean"] <= 1
    assert "probability_agreement" not in report or report["probability_agreement"] is None

    content = path.read_bytes()
    assert metadata_problems(content) == []
    meta = read_embedded(content)
    assert meta["task"] == "segmentation" and meta["output"]["kind"] == "logits" and meta["labels"] == CLASSES
    standard = read_standard(content)
    assert standard["min_parser_version"] == "1.5.0"
    output = standard["subgraph_metadata"][0]["output_tensor_metadata"][0]
    assert output["name"] == "segmentation_masks" and output["associated_files"][0]["type"] == 2  # TENSOR_AXIS_LABELS
    assert standard["files"]["labels.txt"].decode().splitlines() == CLASSES
    assert segmenter_activation(standard) == ACTIVATION_SOFTMAX
    normalization = standard["subgraph_metadata"][0]["input_tensor_metadata"][0]["process_units"][0]["options"][1]
    assert normalization == {"mean": [0.0], "std": [1.0]}  # the camera's bytes as they are


@pytest.mark.parametrize("edit, problem", [
    (lambda sub: sub.pop("custom_metadata"), "names no readable activation (SEGMENTER_METADATA)"),
    (lambda sub: sub["custom_metadata"][0].update(data=b"garbage!" * 4), "names no readable activation"),
    (lambda sub: sub["custom_metadata"][0].update(data=serialize({"activation": ACTIVATION_NONE},
                                                                 "ImageSegmenterOptions", b"V001")),
     "names no activation for a segmenter that outputs logits"),
], ids=["no-segmenter-metadata", "unreadable-segmenter-metadata", "no-softmax"])
def test_check_lists_a_segmenter_entry_mediapipe_would_misread(segmenter, edit, problem):
    _, path, _, _ = segmenter
    content = path.read_bytes()
    standard = read_standard(content)
    files = standard.pop("files")
    edit(standard["subgraph_metadata"][0])
    problems = metadata_problems(populate(content, standard, files))
    assert any(problem in p for p in problems), problems


def test_mediapipe_image_segmenter_loads_the_file_and_agrees_with_litert(segmenter, shapes, tmp_path):
    if missing("mediapipe"):
        pytest.skip(missing("mediapipe"))
    _, path, _, _ = segmenter
    content = path.read_bytes()
    pixels, _ = _val_crops(shapes, get_spec(NAME).preprocessing_at(SIZE))
    category, confidence, labels = _segment(path, pixels, tmp_path)
    assert labels == CLASSES  # from the file
    assert category.shape == pixels.shape[:3] and confidence.shape == (len(pixels), len(CLASSES), SIZE, SIZE)
    np.testing.assert_allclose(confidence.sum(axis=1), 1.0, atol=1e-4)  # the softmax the metadata names
    assert np.mean(category == _litert_classes(content, pixels)) >= 0.98


def test_task_library_image_segmenter_loads_the_files_as_they_are_and_agrees_with_litert(segmenter, shapes,
                                                                                         tmp_path):
    """The Task Library reads the same standard metadata (labels on the output, the float file's
    normalisation) and argmaxes the output as it is, at the model's output size. The fp32 file: LiteRT's
    argmax cell for cell. The int8 file runs on TFLite's builtin int8 kernels of 2022, and on random weights
    int8 kernels disagree: LiteRT's own builtin and XNNPACK kernels pick the same class on 0.90 of the
    cells here, the Task Library and XNNPACK on 0.958 (measured)."""
    if missing("task_library"):
        pytest.skip(missing("task_library"))
    _, int8_path, _, fp32_path = segmenter
    pixels, _ = _val_crops(shapes, get_spec(NAME).preprocessing_at(SIZE))
    for path, agree_at_least in ((fp32_path, 1.0), (int8_path, 0.95)):
        category, confidence, labels = _segment(path, pixels, tmp_path, "task_library")
        assert labels == CLASSES
        logits = _litert_logits(path.read_bytes(), pixels)
        assert category.shape == logits.shape[:3] == (len(pixels), SIZE // 16, SIZE // 16)
        confidence = np.moveaxis(confidence, 1, -1)  # the output (dequantized), no activation applied
        np.testing.assert_array_equal(category, confidence.argmax(-1))
        if path == fp32_path:
            np.testing.assert_allclose(confidence, logits, atol=1e-4)
        assert np.mean(category == logits.argmax(-1)) >= agree_at_least, (path.name, category, logits.argmax(-1))


def test_eval_of_the_file_scores_what_mediapipe_shows(segmenter, shapes, tmp_path):
    """The mIoU of MediaPipe's category masks on the val crops equals `edgevit eval`'s of the file."""
    if missing("mediapipe"):
        pytest.skip(missing("mediapipe"))
    _, path, _, _ = segmenter
    pixels, masks = _val_crops(shapes, get_spec(NAME).preprocessing_at(SIZE))
    category, _, _ = _segment(path, pixels, tmp_path)
    tally = SegmentationTally(CLASSES)
    tally.add(category, masks)
    assert abs(tally.report()["miou"] - evaluate(str(path), str(shapes))["miou"]) <= 0.02


def _litert_logits(content, pixels):
    """LiteRT's outputs of the crops, [N, h, w, classes]."""
    logits = run_in_process(content, file_inputs(content, normalise(pixels, get_spec(NAME).preprocessing_at(SIZE))))
    return logits.reshape(len(pixels), *logits.shape[-3:])


def _litert_classes(content, pixels):
    """LiteRT's logits of the crops, resized and argmaxed as MediaPipe does."""
    return upsampled_classes(_litert_logits(content, pixels), SIZE, SIZE)


def test_eval_scores_the_keras_segmenter_and_its_file_alike(segmenter, shapes):
    """On random weights, int8's rounding moves the boundaries the resized logits draw (a 64 px crop is 4x4
    logits): the fp32 file here, a trained int8 one in the slow test below."""
    keras_path, _, _, path = segmenter
    keras_report, file_report = evaluate(str(keras_path), str(shapes)), evaluate(str(path), str(shapes))
    for report in (keras_report, file_report):
        assert report["task"] == "segmentation" and report["images"] == 12 and report["unreadable_skipped"] == 0
        assert 0 <= report["miou"] <= 1 and set(report["per_class_iou"]) <= set(CLASSES)
        assert report["pixels"] < 12 * SIZE * SIZE  # the 255 border of each square is not scored
    assert abs(keras_report["miou"] - file_report["miou"]) <= 0.02
    assert abs(keras_report["pixel_accuracy"] - file_report["pixel_accuracy"]) <= 0.02


def test_eval_counts_an_unreadable_image_and_mask_by_reason(segmenter, shapes, tmp_path):
    import shutil

    _, path, _, _ = segmenter
    folder = shutil.copytree(shapes, tmp_path / "shapes")
    (folder / "val" / "images" / "0.jpg").write_bytes(b"not a jpeg")
    (folder / "val" / "masks" / "1.png").write_bytes(b"not a png")
    code = CliRunner().invoke(main, ["eval", str(path), "--data", str(folder), "--json"])
    assert code.exit_code == 0, code.stderr
    report = json.loads(code.stdout)
    assert report["images"] == 10 and report["unreadable_skipped"] == 2 and sum(report["skipped_reasons"].values()) == 2


def test_check_and_bench_read_the_segmenter(segmenter):
    _, path, _, _ = segmenter
    result = CliRunner().invoke(main, ["check", str(path), "--nnapi", "--json"])
    assert result.exit_code == 0, result.stderr
    checked = json.loads(result.stdout)
    assert checked["metadata"]["problems"] == [] and checked["metadata"]["edgevit"]["task"] == "segmentation"
    result = CliRunner().invoke(main, ["bench", str(path), "--threads", "1", "--host-kernels", "xnnpack", "--runs",
                                       "2", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("args, message", [
    (lambda keras_path, tflite, shapes, classes: ["eval", tflite, "--data", classes],
     "is a segmenter; {classes} is not a segmentation folder"),
    (lambda keras_path, tflite, shapes, classes: ["eval", keras_path, "--data", classes],
     "is a segmenter; {classes} is not a segmentation folder"),
], ids=["eval-segmenter-file-on-class-folders", "eval-keras-segmenter-on-class-folders"])
def test_segmenter_where_a_classifier_belongs_is_one_error_line(segmenter, shapes, tmp_path, monkeypatch, args,
                                                                  message):
    from tests.test_bad_inputs import demo_folder, image_folder, snapshot

    keras_path, tflite, _, _ = segmenter
    monkeypatch.chdir(tmp_path)
    classes = image_folder(tmp_path / "classes")
    demo_folder(tmp_path)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(main, [str(a) for a in args(keras_path, tflite, shapes, classes)])
    err = result.stderr
    assert result.exit_code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert message.format(classes=classes) in err
    assert snapshot(tmp_path) == before


def test_bundle_puts_the_segmenter_into_the_android_demo(segmenter, tmp_path):
    """The app's segmenter mode reads the file's metadata: task, logits [1, h, w, classes], one label a class."""
    from tests.test_bad_inputs import demo_folder

    _, tflite, _, _ = segmenter
    demo = demo_folder(tmp_path)
    result = CliRunner().invoke(main, ["bundle", str(tflite), "--android-demo", str(demo), "--json"])
    assert result.exit_code == 0, result.stderr
    assets = demo / "app" / "src" / "main" / "assets"
    meta = json.loads((assets / "model.json").read_text())
    assert meta["task"] == "segmentation" and meta["output"]["shape"] == [1, SIZE // 16, SIZE // 16, len(CLASSES)]
    assert (assets / "labels.txt").read_text().splitlines() == CLASSES
    assert (assets / "model.tflite").read_bytes() == tflite.read_bytes()


def test_a_classifier_on_a_segmentation_folder_is_one_error_line(shapes, tmp_path, monkeypatch):
    from tests.test_bad_inputs import edgevit_tflite, snapshot

    monkeypatch.chdir(tmp_path)
    model = edgevit_tflite(tmp_path / "m.tflite", classes=CLASSES)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(main, ["eval", str(model), "--data", str(shapes)])
    err = result.stderr
    assert result.exit_code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {shapes} is a segmentation folder") and "plain is an image classification" in err
    assert snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_float_segmenter_files_load_in_mediapipe_as_they_are(shapes, tmp_path, precision):
    if missing("mediapipe"):
        pytest.skip(missing("mediapipe"))
    import keras

    keras.utils.set_random_seed(0)
    model = edgevit.create_model(NAME, num_classes=len(CLASSES), input_size=SIZE)
    set_class_names(model, CLASSES)
    path = tmp_path / f"seg_{precision}.tflite"
    report = _export(model, shapes, path, precision).to_dict()
    assert report["io"]["input"]["dtype"] == "float32" and report["agreement"]["cosine_mean"] > 0.999
    content = path.read_bytes()
    assert metadata_problems(content) == []
    pixels, _ = _val_crops(shapes, get_spec(NAME).preprocessing_at(SIZE))
    category, _, labels = _segment(path, pixels, tmp_path)
    assert labels == CLASSES
    assert np.mean(category == _litert_classes(content, pixels)) >= 0.98


@pytest.mark.slow
def test_eval_of_a_trained_segmenter_and_its_int8_file_agree(tmp_path):
    """A segmenter trained on the shapes (12 full-batch steps, about 95 s here): `edgevit eval` of the .keras
    and of its int8 file within 0.02 mIoU (measured: 0.693 and 0.676)."""
    import keras

    from edgevit.models.batchnorm import recalibrate_batchnorm

    folder = make_segmentation_folder(tmp_path / "shapes", classes=tuple(CLASSES), per_split=24, size=(80, 64))
    keras.utils.set_random_seed(0)
    model = edgevit.create_model(NAME, num_classes=len(CLASSES), input_size=SIZE)
    set_class_names(model, CLASSES)
    pre = get_spec(NAME).preprocessing_at(SIZE)
    x, masks = ImageStream(find_segmentation_dataset(folder).train, pre).read_all(SIZE)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=255))
    model.fit(x, masks[:, 8::16, 8::16], batch_size=len(x), epochs=12, verbose=0)  # the mask at each logit's centre
    recalibrate_batchnorm(model, x)
    save_model(model, tmp_path / "seg.keras")
    report = _export(model, folder, tmp_path / "seg_int8.tflite", "int8", recalibrate=False).to_dict()
    assert report["agreement"]["top1_agreement"] >= 0.98
    keras_miou = evaluate(str(tmp_path / "seg.keras"), str(folder))["miou"]
    assert abs(keras_miou - evaluate(str(tmp_path / "seg_int8.tflite"), str(folder))["miou"]) <= 0.02
