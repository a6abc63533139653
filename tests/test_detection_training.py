"""A detector trained by `edgevit finetune` and `edgevit qat` on a COCO-layout
folder of synthetic shapes (boxes travel with their images, cvnets' SSD
multibox loss), scored by `edgevit eval` (COCO mAP through pycocotools) as
a .keras model and as a .tflite file whose scores are logits or
probabilities without the background."""
import json

import numpy as np
from click.testing import CliRunner

from edgevit.cli import main
from edgevit.evaluate import class_probabilities
from tests.test_detection_data import SHAPES, make_detection_folder

SIZE = 128
MODEL = "ssdlite_mobilevit_v1_xxs"


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_finetune_qat_and_eval_of_a_detector_on_boxes(tmp_path):
    """ssdlite_mobilevit_v1_xxs fine-tuned (1 epoch) then trained
    quantization-aware (1 step) by the commands on 8 images of shapes at
    64 px, each .keras file scored by `edgevit eval`: the figures are
    there and in range (what they reach: the slow test below)."""
    data = make_detection_folder(tmp_path / "shapes", per_split=8)
    finetuned = run("finetune", MODEL, "--data", data, "--input-size", 64, "--epochs", 1, "--batch-size", 8,
                    "-o", tmp_path / "det.keras", "--json")
    assert finetuned["classes"] == ["background", *SHAPES]
    record = finetuned["history"][-1]
    assert {"val_loss", "val_anchor_accuracy", "train_anchor_accuracy"} <= set(record) and record["images"] == 8
    assert np.isfinite(finetuned["val_loss"]) and finetuned["val_loss"] > 0
    report = run("eval", tmp_path / "det.keras", "--data", data, "--json")
    assert report["task"] == "detection" and report["images"] == 8 and report["found"] == 8
    assert report["boxes"] == sum(report["boxes_per_class"].values()) > 8
    assert 0.0 <= report["map"] <= report["ap50"] <= 1.0 and set(report["per_class_ap"]) <= set(SHAPES)
    qat = run("qat", tmp_path / "det.keras", "--data", data, "--epochs", 1, "--steps-per-epoch", 1,
              "--batch-size", 8, "--calib-batches", 1, "-o", tmp_path / "det_qat.keras", "--json")
    assert {"float_val_loss", "qat_val_loss_calibrated", "val_loss"} <= set(qat)
    assert qat["float_val_loss"] == finetuned["val_loss"]
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "det_qat.keras"), "--data", str(data)])
    assert result.exit_code == 0 and "mAP (IoU 0.5:0.95)" in result.output and "AP50" in result.output


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
    rng = np.random.default_rng(0)
    regressions, logits = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    for scores in (logits, expected):
        np.testing.assert_allclose(class_probabilities([regressions, scores], 3)[1], expected, rtol=1e-6)
    without_background = class_probabilities([regressions, expected[..., 1:]], 3)[1]
    np.testing.assert_allclose(without_background[..., 1:], expected[..., 1:])
    assert not without_background[..., 0].any()
