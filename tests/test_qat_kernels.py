"""A QAT model and its int8 file compute the same on the kernels users meet:
this host's x86 XNNPACK, XNNPACK's kernels of older x86 CPUs (AVX2 without
AVX-512, SSE4 without AVX: emulated, their int8 arithmetic differs), and
the phone's Arm64 kernels (emulated), whose int8 SOFTMAX and BATCH_MATMUL
round otherwise (the QAT model then follows "arm64" kernels); after
calibration, and after `edgevit qat` has trained the model."""
import numpy as np
import pytest
from click.testing import CliRunner

import edgevit
from edgevit.cli import main
from edgevit.data.sample_photos import sample_batch
from edgevit.export.convert import convert
from edgevit.litert.agreement import agreement
from edgevit.litert.run_model import run_in_child
from edgevit.litert.x86_levels import LEVELS
from edgevit.quantize.kernel_arithmetic import targeting_kernels
from edgevit.registry import get_spec
from edgevit.saving import load_model
from tests.helpers import (
    FEW_BLOCKS,
    SMALLEST,
    X86_EMULATOR_MISSING,
    X86_KERNELS,
    int8_file_and_qat,
    needs_arm,
    outputs,
    with_few_blocks,
)

# CrossViT's bicubic resize is two FULLY_CONNECTED ops with constant matrices, which the QAT model
# fake-quantizes as float products instead of requantizing their int32 accumulators: about one element
# in 10^4 a step off, on every kernel set alike
ACCEPTANCE = {"crossvit_tiny"}
# the command's models for the default suite: one v1-based MobileViT (multi-head attention) and one
# v2-based (GroupNorm, separable attention)
DEFAULT_SUITE = ("mobilevit_v3_xxs", "mobilevit_v2_050")
# Not yet what the test promises, measured 2026-11-28 (AVX-512 host, LiteRT 2.3): after two steps of
# `edgevit qat`, a few logits off now and then (DeiT). (vit_tiny16's Arm64 miss, its SOFTMAX lookup, is exact
# since the QAT model computes Arm64's SOFTMAX and BATCH_MATMUL.)
NOT_YET_AFTER_TRAINING = {
    "deit_tiny": "on this host's x86 kernels 2 of 16 logits off, up to 0.032, in 2 of 11 trainings",
}


def trained_case(name: str):
    if name in DEFAULT_SUITE:
        return name
    marks = [pytest.mark.slow]
    if name in NOT_YET_AFTER_TRAINING:
        marks.append(pytest.mark.xfail(strict=False, reason=NOT_YET_AFTER_TRAINING[name]))
    return pytest.param(name, marks=marks)


def within_acceptance(expected, actual, where):
    """The bounds where an op's int8 arithmetic is LiteRT's own (SOFTMAX, a
    resize): the same top-1 on every input, mean logit cosine >= 0.999."""
    result = agreement(expected, actual)
    assert result["top1_agreement"] == 1.0 and result["cosine_mean"] >= 0.999, (where, result)


# v1 at 128 px costs the default suite ~125 s on the 2-core host (its 96 px run, within the acceptance bounds
# only, cost ~105 s): under -m slow; the default suite's v1-based attention is mobilevit_v3_xxs's, trained by the
# command, below
@pytest.fixture(scope="module", params=[("mobilevit_v2_050", 96), ("mobilevit_v3_050", 96),
                                        pytest.param(("mobilevit_v1_xxs", 128), marks=pytest.mark.slow)],
                ids=lambda case: case[0])
def mobilevit_qat(request, tmp_path_factory):
    """A QAT MobileViT with trained-scale weights, calibrated on 16 sample
    photos: its int8 file, the photos, its outputs and the QAT model. v1 at
    128 px: at 96 its 3x3 map is resized to the patch grid, which the QAT
    model rounds otherwise (measured: 27-31 of 48 logits off on every
    kernel set)."""
    import keras

    keras.utils.set_random_seed(0)
    name, size = request.param
    pre = get_spec(name).preprocessing_at(size)
    model = edgevit.create_model(name, num_classes=3, input_size=size)
    x = sample_batch(pre, 16)
    path, qat = int8_file_and_qat(tmp_path_factory.mktemp("qat"), model, x, pre.value_range)
    with targeting_kernels("x86"):
        return path, x, outputs(qat, x), qat


@pytest.mark.parametrize("x86", X86_KERNELS)
def test_int8_file_of_a_mobilevit_qat_model_computes_what_it_computes(mobilevit_qat, x86):
    """MobileViT v2's GroupNorm scales a whole map by one RSQRT of one MEAN:
    one level off there (a MEAN, or the SUB before it, rounded from float
    values instead of the kernel's integers) moves every element after it.
    On sample photos, with trained-scale weights, every logit of the int8
    file equals the QAT model's on this host's XNNPACK and on the kernels
    of x86 CPUs without AVX-512 or AVX, whose int8 MEAN over a whole map
    overflowed (edgevit/layers/norm.py)."""
    path, x, expected, _ = mobilevit_qat
    np.testing.assert_array_equal(run_in_child(path, x, x86_level=x86), expected)


@needs_arm
def test_on_arm64_kernels_a_mobilevit_file_computes_what_its_qat_model_computes(mobilevit_qat):
    """On the phone's kernels (LiteRT's Arm64 build, a Cortex-A76's), the
    int8 SOFTMAX reads a 16-bit integer exp table and a fixed-point 1/sum
    (x86: a float table and sum), and attention's int8 BATCH_MATMUL rounds
    the exact product half up (x86: the float32 product half to even); the
    QAT model targeting "arm64" kernels rounds both so: every logit equals
    its QAT model's (measured with x86's SOFTMAX: 4 and 8 of 48 logits off
    in the v2-based models; with Arm64's SOFTMAX and x86's BATCH_MATMUL, 3
    of 48 in v1 at 128 px, from one element of 16,384 a step apart)."""
    from edgevit.litert.arm import PROFILES, find_emulator, run_guest

    path, x, _, qat = mobilevit_qat
    with targeting_kernels("arm64"):
        expected = outputs(qat, x)
    np.testing.assert_array_equal(run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"], expected)


def near_tie_logits(rows: int, width: int, lo: float, hi: float):
    """``rows`` rows of ``width`` int8 logits on the grid of [lo, hi] (as
    floats an app quantizes back to those levels), those of 100 x ``rows``
    random rows whose exact softmax x 256 lies nearest a rounding midpoint,
    where the kernels' roundings part."""
    from edgevit.quantize.int8_ranges import quantization_params

    scale, zero_point, _ = (float(v) for v in quantization_params(lo, hi))
    levels = np.random.default_rng(0).integers(-128, 128, (100 * rows, width))
    exp = np.exp(scale * (levels - levels.max(-1, keepdims=True)))
    steps = 256.0 * exp / exp.sum(-1, keepdims=True)
    nearest = np.argsort(np.abs(steps - np.floor(steps) - 0.5).min(-1))[:rows]
    return ((levels[nearest] - zero_point) * np.float32(scale)).astype(np.float32)[None]


def assert_kernel_sets_part_and_the_qat_model_computes_each(path, qat, x):
    """``qat``'s int8 file, written to ``path``, computes ``x`` otherwise on
    x86 (this host) and Arm64 (emulated A76) kernels, and the QAT model
    computes each when it targets it."""
    from edgevit.litert.arm import PROFILES, find_emulator, run_guest

    path.write_bytes(convert(qat, "int8", None, "int8"))
    files = {"x86": run_in_child(path, x),
             "arm64": run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"]}
    assert np.sum(files["x86"] != files["arm64"]) > 0
    for kernels, actual in files.items():
        with targeting_kernels(kernels):
            np.testing.assert_array_equal(outputs(qat, x), actual, err_msg=kernels)


@needs_arm
def test_the_qat_softmax_computes_what_each_kernel_sets_int8_softmax_computes(tmp_path):
    """One int8 SOFTMAX over rows of 20 (16 in a vector, 4 one by one on
    Arm64) dense in near-ties: x86's float exp table and Arm64's 16-bit
    integer one round some outputs a step apart, and the QAT model computes
    every output of each, targeting its kernels."""
    import keras

    from edgevit.quantize.qat import quantize_model

    x = near_tie_logits(512, 20, -4.0, 4.0)
    inputs = keras.Input(x.shape[1:])
    qat = quantize_model(keras.Model(inputs, keras.layers.Softmax()(inputs), name="softmax"), x,
                         input_range=(-4.0, 4.0))
    assert_kernel_sets_part_and_the_qat_model_computes_each(tmp_path / "softmax.tflite", qat, x)


@needs_arm
def test_the_qat_matmul_computes_what_each_kernel_sets_int8_batch_matmul_computes(tmp_path):
    """Attention's context matmul (softmax x values) rounds its int32
    accumulator by XNNPACK's float32 product, half to even, on x86, and by
    the exact product, half up, on Arm64 ("rndnu"): calibrated so that the
    values and the context share a grid (M = 1/256) and with zero queries
    (a uniform softmax, 16/256 on every kernel), each context is a sum of 16
    value levels over 16 and every sum of 8 mod 16 is a midpoint: the
    kernels part on the even ones and the QAT model computes each."""
    import keras

    from edgevit.layers import HeadAttention, TokenSlice
    from edgevit.quantize.qat import quantize_model

    tokens, channels, step = 16, 32, np.float32(8 / 255)  # step: the grid of the input range [-4, 4]
    inputs = keras.Input((3 * tokens, channels))
    q, k, v = (TokenSlice(i * tokens, (i + 1) * tokens)(inputs) for i in range(3))
    rng = np.random.default_rng(0)
    calibration = np.zeros((16, 3 * tokens, channels), np.float32)
    calibration[:, tokens:2 * tokens] = rng.integers(-128, 128, (16, tokens, channels)) * step
    calibration[:, 2 * tokens:] = rng.integers(-128, 128, (16, 1, channels)) * step  # equal tokens: context = v
    calibration[0, 2 * tokens:, :2] = [-128 * step, 127 * step]
    qat = quantize_model(keras.Model(inputs, HeadAttention(1)([q, k, v]), name="context"), calibration,
                         input_range=(-4.0, 4.0))
    x = np.zeros((2, 3 * tokens, channels), np.float32)
    x[:, tokens:] = rng.integers(-128, 128, (2, 2 * tokens, channels)) * step
    assert_kernel_sets_part_and_the_qat_model_computes_each(tmp_path / "context.tflite", qat, x)


def test_the_qat_model_targets_the_kernels_of_the_machine_running_it_unless_told(monkeypatch):
    import platform

    from edgevit.errors import EdgevitError
    from edgevit.quantize.kernel_arithmetic import target_kernels

    for machine, kernels in (("aarch64", "arm64"), ("arm64", "arm64"), ("x86_64", "x86"), ("AMD64", "x86")):
        monkeypatch.setattr(platform, "machine", lambda machine=machine: machine)
        assert target_kernels() == kernels
        with targeting_kernels("x86" if kernels == "arm64" else "arm64"):
            assert target_kernels() != kernels
    with pytest.raises(EdgevitError, match="arm64"), targeting_kernels("arm"):
        pass


def qat_by_the_command(name, photo_folder, folder):
    """`edgevit qat NAME` from random weights on ``photo_folder`` (2 x 4
    training photos) at the smallest input size of SMALLEST: ranges
    calibrated on one batch, then one epoch of two steps; the saved model."""
    output = folder / f"{name}_qat.keras"
    result = CliRunner().invoke(main, ["qat", name, "--data", str(photo_folder), "--input-size",
                                       str(SMALLEST[name]), "--epochs", "1", "--batch-size", "4",
                                       "--calib-batches", "1", "-o", str(output)])
    assert result.exit_code == 0, result.stderr
    return load_model(output)


@pytest.mark.parametrize("name", [trained_case(name) for name in SMALLEST])
def test_a_model_trained_by_edgevit_qat_computes_what_its_int8_file_computes(name, photos, tmp_path,
                                                                              monkeypatch):
    """Training moves the weights, the ranges and the kernel grids that the
    exact arithmetic reads (the training step leaves that arithmetic out):
    after `edgevit qat`, every logit of the file on 8 sample photos equals
    the QAT model's on this host's kernels and, emulated, on AVX2 and SSE4
    kernels, and on the phone's Arm64 kernels the QAT model's targeting
    them (their int8 SOFTMAX rounds from a 16-bit exp table and a
    fixed-point 1/sum; x86's from a float table and a float sum)."""
    if name in FEW_BLOCKS:
        with_few_blocks(name, monkeypatch)
    qat = qat_by_the_command(name, photos, tmp_path)
    path = tmp_path / f"{name}_int8.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    x = sample_batch(get_spec(name).preprocessing_at(SMALLEST[name]), 8)

    def agrees(expected, actual, where):
        if name in ACCEPTANCE:
            within_acceptance(expected, actual, where)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=where)

    with targeting_kernels("x86"):
        expected = outputs(qat, x)
    for level in [None] if X86_EMULATOR_MISSING else [None, *LEVELS]:
        agrees(expected, run_in_child(path, x, x86_level=level), f"{name} on {level or 'this host'}'s x86 kernels")
    from edgevit.litert.arm import PROFILES, emulator_missing, find_emulator, run_guest

    if emulator_missing() is None:
        with targeting_kernels("arm64"):
            expected = outputs(qat, x)
        agrees(expected, run_guest(find_emulator(), path, x, PROFILES["a76"]).outputs["xnnpack"],
               f"{name} on Arm64 kernels")


def groupnorm_model(size: int, **norm_options):
    """A convolution and a GroupNorm-style LayerNorm over its whole map."""
    import keras

    from edgevit.layers import LayerNorm

    inputs = keras.Input((size, size, 3), name="image")
    x = keras.layers.Conv2D(64, 3, padding="same", name="conv")(inputs)
    x = LayerNorm(axes=(1, 2, 3), name="norm", **norm_options)(x)
    return keras.Model(inputs, keras.layers.Conv2D(4, 1, name="head")(x), name="groupnorm")


def test_a_groupnorms_mean_runs_over_the_positions_first_so_no_x86_kernel_overflows(tmp_path):
    """Over a 16x16x64 map (16,384 elements) one int8 MEAN overflows the
    16-bit sums of x86 kernels without AVX-512; the norm takes the mean of
    the per-channel means instead (a MEAN that keeps the channels, then one
    over 64 channels), and the QAT model rounds both as XNNPACK does."""
    from edgevit.litert.flatbuffer import read
    from edgevit.litert.xnnpack import means_wrong_on_older_x86, xnnpack_plan
    from edgevit.quantize.qat import quantization_ranges

    x = np.random.default_rng(0).normal(0, 1, (8, 16, 16, 3)).astype(np.float32)
    path, qat = int8_file_and_qat(tmp_path, groupnorm_model(16), x, (-4.0, 4.0))
    graph = read(path.read_bytes())
    means = [op for op in graph.ops if op.name == "MEAN"]
    assert [tuple(op.outputs[0].shape) for op in means] == [(1, 1, 1, 64), (1, 1, 1, 1)] * 2
    assert not means_wrong_on_older_x86(graph) and not xnnpack_plan(path.read_bytes()).summary()["warnings"]
    assert {"norm/q_channel_mean", "norm/q_channel_variance"} <= set(quantization_ranges(qat))
    np.testing.assert_array_equal(run_in_child(path, x), outputs(qat, x))


def test_a_qat_groupnorm_saved_before_the_per_channel_means_keeps_its_one_mean_and_is_flagged(tmp_path):
    """A QAT model saved by an earlier edgevit holds no ranges for the
    per-channel means: it loads with the one MEAN it was trained with, and
    the XNNPACK plan of its file warns which x86 CPUs compute that MEAN
    wrongly."""
    import keras

    from edgevit.export.audit import audit
    from edgevit.quantize.multi_op_layers import QuantLayerNorm
    from edgevit.quantize.qat import quantize_model

    norm = next(layer for layer in quantize_model(groupnorm_model(16)).layers if isinstance(layer, QuantLayerNorm))
    saved_before = {key: value for key, value in norm.get_config().items() if key != "per_channel_means"}
    legacy = QuantLayerNorm.from_config(saved_before)
    assert norm.per_channel_means and not legacy.per_channel_means
    assert set(norm.point_tags()) - set(legacy.point_tags()) == {"channel_mean", "channel_variance"}

    x = np.random.default_rng(0).normal(0, 1, (8, 16, 16, 3)).astype(np.float32)
    path, qat = int8_file_and_qat(tmp_path, groupnorm_model(16, per_channel_means=False), x, (-4.0, 4.0))
    qat.save(tmp_path / "legacy.keras")
    reloaded = keras.saving.load_model(tmp_path / "legacy.keras")
    np.testing.assert_array_equal(outputs(reloaded, x), outputs(qat, x))
    warnings = audit(path.read_bytes(), "int8", "int8").delegates["xnnpack"]["warnings"]
    assert [(w["op"], w["count"]) for w in warnings] == [("MEAN", 2)] and "AVX-512" in warnings[0]["reason"]
