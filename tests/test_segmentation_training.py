"""A segmenter trained by `edgevit finetune` and `edgevit qat` on a
segmentation folder (masks travel with their images, per-pixel loss over
counted pixels, mIoU), and the QAT model's int8 file computing what the QAT
model computes, per pixel, on this host's kernels, the kernels of older x86
CPUs and the phone's Arm64 kernels (emulated, where installed)."""

import keras
import numpy as np
import pytest
from click.testing import CliRunner

from edgevit.cli import main
from edgevit.data.masks import find_segmentation_dataset
from edgevit.data.stream import ImageStream
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.litert.run_model import run_in_child
from edgevit.quantize.kernel_arithmetic import TARGET_KERNELS, targeting_kernels
from edgevit.saving import load_model, spec_of
from tests.helpers import X86_KERNELS, needs_arm, run_json, outputs
from tests.test_segmentation_data import make_segmentation_folder

SIZE = 64


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """deeplabv3_mobilevit_v1_xxs fine-tuned (2 epochs) then trained
    quantization-aware (1 epoch) by the commands on a shapes folder; the QAT
    model's int8 file, the validation inputs and the QAT model's logits."""
    root = tmp_path_factory.mktemp("segmentation")
    data = make_segmentation_folder(root / "shapes", per_split=8, size=(96, 80))
    finetuned = run_json("finetune", "deeplabv3_mobilevit_v1_xxs", "--data", data, "--input-size", SIZE, "--epochs", 2,
                    "--batch-size", 8, "-o", root / "seg.keras", "--json")
    qat_result = run_json("qat", root / "seg.keras", "--data", data, "--epochs", 1, "--batch-size", 8,
                     "-o", root / "seg_qat.keras", "--json")
    qat = load_model(root / "seg_qat.keras")
    x, masks = ImageStream(find_segmentation_dataset(data).val, spec_of(qat).preprocessing_at(SIZE)).read_all(SIZE)
    path = root / "seg_qat_int8.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    return finetuned, qat_result, path, x, outputs(qat, x)


def test_finetune_and_qat_train_a_segmenter_on_masks_and_report_miou(trained):
    finetuned, qat_result, path, x, expected = trained
    assert [r["epoch"] for r in finetuned["history"]] == [1, 2]
    record = finetuned["history"][-1]
    assert {"val_miou", "val_pixel_accuracy", "train_pixel_accuracy"} <= set(record) and record["images"] == 8
    assert 0.0 <= finetuned["val_miou"] <= 1.0 and finetuned["classes"] == ["background", "square"]
    assert {"float_val_miou", "qat_val_miou_calibrated", "val_miou"} <= set(qat_result)
    assert expected.shape == (8, SIZE // 16, SIZE // 16, 2)  # logits at the output stride


def test_the_int8_file_of_a_qat_segmenter_computes_what_it_computes(trained):
    """Every logit of every pixel the same on this host (measured: all
    equal); no float op in the file."""
    _, _, path, x, expected = trained
    assert not describe(path.read_bytes()).float_ops()
    np.testing.assert_array_equal(run_in_child(path, x, x86_level=None), expected)


@pytest.fixture(scope="module")
def trained_as_users_train(tmp_path_factory):
    """The same commands at a user's scale: 128 px (8 x 8 logits an image),
    32 + 32 images, fine-tuned 12 epochs until the val mIoU is well above
    chance, then 2 QAT epochs, seeded here (a module fixture runs before the
    autouse seed; unseeded, 8 epochs ended at 0.74 in one run, 0.84 in
    another). The default fixture's model is barely trained (tiny logits,
    many tied pixels, 128 pixels where one flip is 0.8 %): it cannot judge
    the kernels' per-pixel agreement."""
    keras.utils.set_random_seed(0)
    root = tmp_path_factory.mktemp("segmentation_trained")
    data = make_segmentation_folder(root / "shapes", per_split=32, size=(192, 160))
    finetuned = run_json("finetune", "deeplabv3_mobilevit_v1_xxs", "--data", data, "--input-size", 128, "--epochs", 12,
                    "--batch-size", 16, "--lr", 2e-3, "-o", root / "seg.keras", "--json")
    qat_result = run_json("qat", root / "seg.keras", "--data", data, "--epochs", 2, "--batch-size", 16,
                     "-o", root / "seg_qat.keras", "--json")
    qat = load_model(root / "seg_qat.keras")
    x, _ = ImageStream(find_segmentation_dataset(data).val, spec_of(qat).preprocessing_at(128)).read_all(128)
    path = root / "seg_qat_int8.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    expected = {}
    for target in TARGET_KERNELS:
        with targeting_kernels(target):
            expected[target] = outputs(qat, x)
    return finetuned, qat_result, path, x, expected


@pytest.mark.slow
def test_finetune_and_qat_train_the_user_scale_segmenter_well_above_chance(trained_as_users_train):
    finetuned, qat_result, _, _, expected = trained_as_users_train
    assert finetuned["val_miou"] >= 0.8 and qat_result["val_miou"] >= 0.8, (finetuned["val_miou"], qat_result)
    assert expected["x86"].shape == (32, 8, 8, 2)


# Arm64, measured 2026-11-29 on the user-scale fixture: this host, AVX2 and SSE4 give every logit equal to the QAT
# model's; Arm64's file differs, and its per-pixel agreement sits on the 0.999 bound. Seeded, 12 epochs (val mIoU
# float 0.805, QAT 0.837): 13 of 32 images off by up to 4 steps (0.56), worst map cosine 0.99940 (mean 0.99991),
# 2 of 2,048 pixels flip (0.99902: passes), their QAT margins 3 steps and 1. Unseeded, 8 epochs (0.844, 0.849):
# 20 images off by up to 2 steps, worst cosine 0.99973, 3 pixels flip (0.99854: fails), two the QAT model ties
# exactly, one it decides by 1 step. A square's edge pixels, which a trained model scores near a tie, are where a
# one-step logit change flips the argmax: 1 pixel in 700-1,000 on Arm64. Every op's int8 output of the seeded file
# (x86 LiteRT 2.3.0 vs aarch64 1.4.0): of the op runs whose exposed inputs are equal, 38 of 243 SOFTMAX runs differ
# (42 of 1,277,952 outputs, one step each), 1 of 450 BATCH_MATMUL runs (1 element, 1 step) and 14 RESHAPE runs
# (1-4 of 64 elements; a copy cannot round, so likely a tensor XNNPACK reuses in place after it was read).
# The cause, localised on the default fixture (every op's int8 output, LiteRT 2.3.0 on x86 against LiteRT 1.4.0's
# aarch64 build, Cortex-A76 and qemu-max kernels alike):
# given equal inputs every op computes the same bits except SOFTMAX, 3 of 19,712 outputs one step apart. Every
# aarch64 LiteRT built with clang (optimized_ops.h: TFLITE_SOFTMAX_USE_UINT16_LUT, in every version) writes an int8
# SOFTMAX from exp values rounded to 16-bit integers and a fixed-point 1/sum; x86 builds (1.4.0 as 2.3.0) from a
# float exp table and a float 1/sum, the arithmetic the QAT model's float softmax follows. Numpy models of both
# kernels reproduced all 8,192 outputs of one SOFTMAX; they round 256 x exp / sum differently within ~1e-4 of a half
# step (15.49996: 15 on x86, 16 on Arm). No QAT model can match both kernel sets, which disagree with each other on
# the same input; a SOFTMAX writing int16 (the float table on both) requantized to int8 by a QUANTIZE gave
# bit-identical tensors on both but 1.69x the Arm64 instructions (mobilevit_v3_xs --int8, 256 px: 184.1 M ->
# 310.6 M) and int16 tensors that NNAPI and GPU delegates refuse. The classifiers' files differ on Arm64 the same
# way (mobilevit_v1_xxs at 96 px: 12 of 24 SOFTMAXes with equal inputs, logits up to 8 steps off, worst image's
# cosine 0.9986) and pass their bounds, top-1 and the mean cosine; a segmenter is held to every image's cosine and
# every pixel's argmax.
ARM64 = pytest.param("arm", id="arm64", marks=[needs_arm])


@pytest.mark.slow
@pytest.mark.parametrize("kernels", [*X86_KERNELS, ARM64])
def test_the_int8_file_of_a_user_scale_qat_segmenter_computes_what_it_computes(trained_as_users_train, kernels):
    """The user-scale segmenter's int8 file against its QAT model, per pixel,
    on this host, the emulated AVX2 and SSE4 kernels (measured: every logit
    equal on all three) and the phone's Arm64 kernels (emulated)."""
    _, _, path, x, expected = trained_as_users_train
    assert not describe(path.read_bytes()).float_ops()
    if kernels == "arm":
        from edgevit.litert.arm import PROFILES, find_emulator, run_guest

        actual = run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"]
        expected = expected["arm64"]
    else:
        actual = run_in_child(path, x, x86_level=kernels)
        expected = expected["x86"]
    e, a = expected, actual
    print("MEASURE", kernels, np.mean(e.argmax(-1) == a.argmax(-1)), int(np.sum(e != a)), e.size)
    within_pixel_acceptance(expected, actual, kernels or "host")


def within_pixel_acceptance(expected, actual, where):
    """Per-pixel argmax agreement >= 99.9 % and each image's logit-map
    cosine >= 0.999 (a single pixel's two logits near zero make its own
    cosine noise: 0.08 for a pixel both maps call background)."""
    argmax = np.mean(expected.argmax(-1) == actual.argmax(-1))
    flat_e, flat_a = expected.reshape(len(expected), -1), actual.reshape(len(actual), -1)
    norms = np.linalg.norm(flat_e, axis=1) * np.linalg.norm(flat_a, axis=1)
    cosine = np.where(norms > 0, (flat_e * flat_a).sum(1) / np.maximum(norms, 1e-12), 1.0)
    assert argmax >= 0.999 and cosine.min() >= 0.999, (where, argmax, cosine.min())


def test_a_classifier_on_a_segmentation_folder_and_a_segmenter_on_class_folders_are_one_error(tmp_path):
    data = make_segmentation_folder(tmp_path / "shapes")
    result = CliRunner().invoke(main, ["finetune", "mobilevit_v3_xxs", "--data", str(data), "--input-size", "64",
                                       "-o", str(tmp_path / "x.keras")])
    assert result.exit_code == 1 and result.stderr.startswith("error: mobilevit_v3_xxs is a classifier"), \
        result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "x.keras").exists()
    result = CliRunner().invoke(main, ["finetune", "deeplabv3_mobilevit_v1_xxs", "--data", str(data),
                                       "--val-split", "0.2", "-o", str(tmp_path / "x.keras")])
    assert result.exit_code == 1 and "leave --val-split out" in result.stderr
