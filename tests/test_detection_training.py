"""A detector trained by `edgevit finetune` and `edgevit qat` on a COCO-layout
folder of synthetic shapes (boxes travel with their images, cvnets' SSD
multibox loss), scored by `edgevit eval` (COCO mAP through pycocotools) as
a .keras model and as a .tflite file whose scores are logits or
probabilities without the background."""

import numpy as np
import pytest
from click.testing import CliRunner

from edgevit.cli import main
from edgevit.evaluate import LOGITS, PROBABILITIES, WITHOUT_BACKGROUND, class_probabilities, declared_scores
from tests.helpers import run_json
from tests.test_detection_data import SHAPES, make_detection_folder

SIZE = 128
MODEL = "ssdlite_mobilevit_v1_xxs"


# 12 minutes on the 2-core host shared by other runs (2026-11-29): the QAT step's trace dominates
@pytest.mark.slow
def test_finetune_qat_and_eval_of_a_detector_on_boxes(tmp_path):
    """ssdlite_mobilevit_v1_xxs fine-tuned (1 epoch) then trained
    quantization-aware (1 step) by the commands on 8 images of shapes at
    64 px, each .keras file scored by `edgevit eval`: the figures are
    there and in range."""
    data = make_detection_folder(tmp_path / "shapes", per_split=8)
    finetuned = run_json("finetune", MODEL, "--data", data, "--input-size", 64, "--epochs", 1, "--batch-size", 8,
                    "-o", tmp_path / "det.keras", "--json")
    assert finetuned["classes"] == ["background", *SHAPES]
    record = finetuned["history"][-1]
    assert {"val_loss", "val_anchor_accuracy", "train_anchor_accuracy"} <= set(record) and record["images"] == 8
    assert np.isfinite(finetuned["val_loss"]) and finetuned["val_loss"] > 0
    report = run_json("eval", tmp_path / "det.keras", "--data", data, "--json")
    assert report["task"] == "detection" and report["images"] == 8 and report["found"] == 8
    assert report["boxes"] == sum(report["boxes_per_class"].values()) > 8
    assert 0.0 <= report["map"] <= report["ap50"] <= 1.0 and set(report["per_class_ap"]) <= set(SHAPES)
    qat = run_json("qat", tmp_path / "det.keras", "--data", data, "--epochs", 1, "--steps-per-epoch", 1,
              "--batch-size", 8, "--calib-batches", 1, "-o", tmp_path / "det_qat.keras", "--json")
    assert {"float_val_loss", "qat_val_loss_calibrated", "val_loss"} <= set(qat)
    assert qat["float_val_loss"] == finetuned["val_loss"]
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "det_qat.keras"), "--data", str(data)])
    assert result.exit_code == 0 and "mAP (IoU 0.5:0.95)" in result.output and "AP50" in result.output


def test_the_qat_rewrite_quantizes_every_ssd_head_and_keeps_the_outputs():
    import keras

    from edgevit.quantize.qat import per_channel_weights, quantize_model
    from edgevit.registry import create_model

    model = create_model(MODEL, num_classes=3, input_size=64)
    heads = [layer.name for layer in model.layers if isinstance(layer, keras.layers.Conv2D)
             and layer.name.endswith(("box_conv", "class_conv"))]
    qat = quantize_model(model)
    weights = per_channel_weights(qat)
    assert len(heads) == 12 and all(any(path.startswith(f"{head}/") for path in weights) for head in heads)
    assert [tuple(o.shape) for o in qat.outputs] == [(None, 142, 4), (None, 142, 3)]
    assert qat.output_names == model.output_names == ["boxes", "scores"]


def test_a_detector_on_class_folders_and_a_classifier_on_boxes_are_one_error(tmp_path):
    from edgevit.registry import create_model
    from edgevit.saving import save_model

    data = make_detection_folder(tmp_path / "shapes", per_split=2)
    result = CliRunner().invoke(main, ["finetune", "mobilevit_v3_xxs", "--data", str(data), "--input-size", "64",
                                       "-o", str(tmp_path / "x.keras")])
    assert result.exit_code == 1 and result.stderr.startswith("error: mobilevit_v3_xxs is a classifier"), \
        result.stderr
    assert "a detection folder (boxes)" in result.stderr and not (tmp_path / "x.keras").exists()
    result = CliRunner().invoke(main, ["finetune", MODEL, "--data", str(data), "--val-split", "0.2",
                                       "-o", str(tmp_path / "x.keras")])
    assert result.exit_code == 1 and "leave --val-split out" in result.stderr
    save_model(create_model(MODEL, num_classes=3, input_size=64), tmp_path / "det.keras")
    (tmp_path / "folders" / "val" / "a").mkdir(parents=True)
    (data / "val" / "000.jpg").rename(tmp_path / "folders" / "val" / "a" / "000.jpg")
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "det.keras"), "--data", str(tmp_path / "folders")])
    assert result.exit_code == 1 and "is a detector" in result.stderr and "Traceback" not in result.stderr


def test_a_files_scores_become_probabilities_whichever_form_it_writes():
    """Scores as declared (by the form), or undeclared (None) as their values look."""
    rng = np.random.default_rng(0)
    regressions, logits = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    for scores, declared in ((logits, LOGITS), (expected, PROBABILITIES)):
        for form in (declared, None):
            np.testing.assert_allclose(class_probabilities([regressions, scores], 3, form)[1], expected, rtol=1e-6)
    for form in (WITHOUT_BACKGROUND, None):
        without_background = class_probabilities([regressions, expected[..., 1:]], 3, form)[1]
        np.testing.assert_allclose(without_background[..., 1:], expected[..., 1:])
        assert not without_background[..., 0].any()


def test_declared_scores_are_read_as_declared_where_their_values_would_mislead():
    """Logits that look like probabilities (non-negative, each anchor's
    summing to 1): a .keras detector's are logits, whatever their values; an
    edgevit file's metadata says its scores leave the background out; a
    document that does not say leaves them to their values."""
    from edgevit.export.detection import SCORES

    regressions, logits = np.zeros((1, 2, 4)), np.array([[[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]])
    assert declared_scores(None) == LOGITS
    assert declared_scores({"detection": {"scores": SCORES}}) == WITHOUT_BACKGROUND
    assert declared_scores({"detection": {}}) is None
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(class_probabilities([regressions, logits], 3, declared_scores(None))[1], softmax)
    np.testing.assert_array_equal(class_probabilities([regressions, logits], 3, None)[1], logits)


@pytest.mark.parametrize("form", ["logits", "probabilities without the background"])
def test_a_detector_file_gives_the_probabilities_of_its_keras_model(tmp_path, form):
    """A stand-in detector (two outputs: boxes [1, 16, 4], scores [1, 16, 3])
    converted to a float .tflite that outputs its logits, or its softmax
    without the background as edgevit's detector files do: eval's reading of
    the file gives the Keras model's probabilities."""
    import keras
    import tensorflow as tf

    from edgevit.litert.run_model import outputs_by_signature

    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 3), batch_size=1)
    features = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(image)
    boxes = keras.layers.Reshape((16, 4), name="boxes")(keras.layers.Conv2D(4, 1)(features))
    logits = keras.layers.Reshape((16, 3), name="scores")(keras.layers.Conv2D(3, 1)(features))
    model = keras.Model(image, [boxes, logits])
    scores = logits if form == "logits" else keras.layers.Lambda(lambda t: keras.ops.softmax(t)[..., 1:])(logits)
    content = tf.lite.TFLiteConverter.from_keras_model(keras.Model(image, [boxes, scores])).convert()
    x = np.random.default_rng(1).normal(size=(3, 8, 8, 3)).astype(np.float32)
    expected_boxes, expected_logits = (np.asarray(t) for t in model(x))
    regressions, probabilities = class_probabilities(outputs_by_signature(content)(x), 3, None)  # no metadata
    np.testing.assert_allclose(regressions, expected_boxes, atol=1e-5)
    expected = np.exp(expected_logits) / np.exp(expected_logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities[..., 1:], expected[..., 1:], atol=1e-5)
