"""A segmenter trained by `edgevit finetune` and `edgevit qat` on a
segmentation folder (masks travel with their images, per-pixel loss over
counted pixels, mIoU), and the QAT model's int8 file computing what the QAT
model computes, per pixel, on this host's kernels, the kernels of older x86
CPUs and the phone's Arm64 kernels (emulated, where installed)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgevit.cli import main
from edgevit.data.masks import find_segmentation_dataset
from edgevit.data.stream import ImageStream
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.litert.run_model import run_in_child
from edgevit.saving import load_model, spec_of
from tests.helpers import X86_KERNELS, needs_arm, outputs
from tests.test_segmentation_data import make_segmentation_folder

SIZE = 64


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """deeplabv3_mobilevit_v1_xxs fine-tuned (2 epochs) then trained
    quantization-aware (1 epoch) by the commands on a shapes folder; the QAT
    model's int8 file, the validation inputs and the QAT model's logits."""
    root = tmp_path_factory.mktemp("segmentation")
    data = make_segmentation_folder(root / "shapes", per_split=8, size=(96, 80))
    finetuned = run("finetune", "deeplabv3_mobilevit_v1_xxs", "--data", data, "--input-size", SIZE, "--epochs", 2,
                    "--batch-size", 8, "-o", root / "seg.keras", "--json")
    qat_result = run("qat", root / "seg.keras", "--data", data, "--epochs", 1, "--batch-size", 8,
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


# this host's kernels in the default suite; the emulated ones (about a minute together) with -m slow
@pytest.mark.parametrize("x86", [X86_KERNELS[0], *(pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow],
                                                                id=p.id) for p in X86_KERNELS[1:])])
def test_the_int8_file_of_a_qat_segmenter_computes_what_it_computes(trained, x86):
    """Every logit of every pixel the same on this host (measured: all
    equal); on the emulated kernels within the acceptance bounds; no float
    op in the file."""
    _, _, path, x, expected = trained
    assert not describe(path.read_bytes()).float_ops()
    actual = run_in_child(path, x, x86_level=x86)
    if x86 is None:
        np.testing.assert_array_equal(actual, expected)
    within_pixel_acceptance(expected, actual, x86)


# Localised 2026-11-29 (every op's int8 output on the 8 images, LiteRT 2.3.0 on x86 against LiteRT 1.4.0's
# aarch64 build, Cortex-A76 and qemu-max kernels alike): given equal inputs, every op computes the same bits
# except SOFTMAX, 3 of 19,712 outputs one step apart. Every aarch64 LiteRT built with clang (optimized_ops.h:
# TFLITE_SOFTMAX_USE_UINT16_LUT, in every version) writes an int8 SOFTMAX from exp values rounded to 16-bit
# integers and a fixed-point 1/sum; x86 builds (1.4.0 as 2.3.0) from a float exp table and a float 1/sum, the
# arithmetic the QAT model's float softmax follows (every logit equal here). Numpy models of both kernels
# reproduced all 8,192 outputs of one SOFTMAX; they round 256 x exp / sum differently within ~1e-4 of a half
# step (15.49996: 15 on x86, 16 on Arm). One such step in layer_4's 4 x 4-token attention grew to 7 steps (0.21)
# of one image's logits. No QAT model can match both kernel sets, which disagree with each other on the same
# input; a SOFTMAX writing int16 (the float table on both) requantized to int8 by a QUANTIZE gave bit-identical
# tensors on both but 1.69x the Arm64 instructions (mobilevit_v3_xs --int8, 256 px: 184.1 M -> 310.6 M) and
# int16 tensors that NNAPI and GPU delegates refuse. The classifiers' files differ on Arm64 the same way
# (mobilevit_v1_xxs at 96 px: 12 of 24 SOFTMAXes with equal inputs, logits up to 8 steps off, worst image's
# cosine 0.9986) and pass their bounds, top-1 and the mean cosine; a segmenter is held to every image's cosine
# and every pixel's argmax.
@needs_arm
@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="the int8 SOFTMAX of Arm64's LiteRT (16-bit exp table, fixed-point 1/sum; "
                   "x86: float) rounds one output in ~6,600 a step from the QAT model's, which grows to up to 7 steps "
                   "of the segmenter's logits: worst image's map cosine 0.9986 (0.996-0.9999 and argmax agreement "
                   "0.984-1.0 in 3 runs, 2026-11-29); every other op bit-identical to x86")
def test_on_arm64_kernels_a_qat_segmenters_file_computes_what_it_computes(trained):
    from edgevit.litert.arm import PROFILES, find_emulator, run_guest

    _, _, path, x, expected = trained
    within_pixel_acceptance(expected, run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"], "arm")


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
