"""A detector trained by `edgevit finetune` and `edgevit qat` on generated
shapes, and its int8 file computing what the QAT model computes (issue 55):
the raw outputs the file has (box regressions, each class's softmax score
without the background) and the detections after per-class NMS, on this
host's kernels, the kernels of older x86 CPUs and the phone's Arm64 kernels
(emulated, where installed)."""

import numpy as np
import pytest

from edgevit.data.boxes import find_detection_dataset
from edgevit.data.stream import ImageStream
from edgevit.export.convert import convert, file_outputs
from edgevit.export.detection import anchors_of, confident_detections
from edgevit.export.graph import describe
from edgevit.litert.run_model import run_in_child, split_outputs
from edgevit.quantize.kernel_arithmetic import TARGET_KERNELS, targeting_kernels
from edgevit.saving import load_model, spec_of
from tests.helpers import X86_KERNELS, needs_arm, run_json
from tests.test_detection_data import make_detection_folder

SIZE = 64
MODEL = "ssdlite_mobilevit_v1_xxs"
# each epoch past the first costs 1-2 s: at 30 the validation loss is 69 (123 at 6), with 56-80 boxes an image
# scoring >= 0.5 (74-97 at 6)
EPOCHS = 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """ssdlite_mobilevit_v1_xxs fine-tuned (EPOCHS epochs of 2 steps) then
    trained quantization-aware (1 epoch) by the commands on 8 images of
    shapes at 64 px; the QAT model's int8 file, the validation images and
    what the file must compute on each target's kernels: the QAT model's
    outputs mapped as the export maps them (its softmax as that target's
    int8 SOFTMAX writes it, the background left out)."""
    root = tmp_path_factory.mktemp("detection")
    data = make_detection_folder(root / "shapes", per_split=8)
    run_json("finetune", MODEL, "--data", data, "--input-size", SIZE, "--epochs", EPOCHS, "--batch-size", 4,
             "--lr", 0.002, "-o", root / "det.keras", "--json")
    run_json("qat", root / "det.keras", "--data", data, "--epochs", 1, "--batch-size", 4, "-o", root / "det_qat.keras",
             "--json")
    qat = load_model(root / "det_qat.keras")
    x, _ = ImageStream(find_detection_dataset(data).val, spec_of(qat).preprocessing_at(SIZE)).read_all(SIZE)
    x = np.asarray(x)
    path = root / "det_qat_int8.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    expected = {}
    for target in TARGET_KERNELS:
        with targeting_kernels(target):
            found = file_outputs(qat, qat(x, training=False), probabilities=True, quantized_softmax=True)
            expected[target] = np.asarray(found["boxes"]), np.asarray(found["scores"])
    return path, x, expected, anchors_of(qat)


# Training by the commands takes the fixture 9-11 minutes on this 2-core host (the first epoch's trace, the QAT
# rewrite and calibration; each further epoch 1-2 s): every test here runs with -m slow.
# Measured 2026-11-29 (three trainings, 6 and 30 epochs): every box and score of the file equal to the QAT model's
# on the host's AVX-512, emulated AVX2 and SSE4 kernels and, the QAT model targeting "arm64" kernels, on Arm64.
# Before, the QAT model requantized the pooled level's MEAN over one position, which the converter drops
# (0.04-0.44 % of the scores up to 0.09 off), and computed x86's softmax for Arm64's table (score cosine 0.987).
# On Arm64, 4 of 5 trainings gave every box and score equal then; one, 353 of 4,544 box values (7.8 %) of some
# images off. The one other Arm64 rounding found op by op since is the int8 BATCH_MATMUL's (XNNPACK's rndnu, ruy's
# single rounding; that training was not kept to confirm it), which the QAT model targeting "arm64" now computes:
# every box and score equal on Arm64 in 2 of 2 trainings since.
ARM64 = pytest.param("arm", id="arm64", marks=needs_arm)


@pytest.mark.slow
@pytest.mark.parametrize("kernels", [*X86_KERNELS, ARM64])
def test_the_int8_file_of_a_qat_detector_computes_what_it_computes(trained, kernels):
    """Every box regression and score of the int8 file equals the QAT
    model's on this host, the kernels of older x86 CPUs and the phone's
    Arm64 kernels (emulated), so its confident detections are the same on
    every image; no float op in the file."""
    path, x, expected, anchors = trained
    assert not describe(path.read_bytes()).float_ops()
    if kernels == "arm":
        from edgevit.litert.arm import PROFILES, find_emulator, run_guest

        joined = run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"]
        boxes, scores = expected["arm64"]
    else:
        joined = run_in_child(path, x, x86_level=kernels)
        boxes, scores = expected["x86"]
    file_boxes, file_scores = split_outputs(path.read_bytes(), joined)
    np.testing.assert_array_equal(file_boxes, boxes, err_msg=kernels or "host")
    np.testing.assert_array_equal(file_scores, scores, err_msg=kernels or "host")
    found = [confident_detections(b, s, anchors) for b, s in zip(boxes, scores)]
    assert sum(len(classes) for _, classes in found) >= len(x), "too few detections for the check to mean anything"
