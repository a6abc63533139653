"""The rewrites of calibrated int8 files that let NNAPI (below Android 14)
and XNNPACK take every op: LayerNorm's RSQRT as two convolutions, and a sum
written as a mean times a count on a grid of its own."""
import keras
import numpy as np
import pytest

import edgevit.export.convert as convert_module
from edgevit.export.convert import convert
from edgevit.litert import arm
from edgevit.litert.flatbuffer import read, schema_module
from edgevit.litert.gpu_rules import check_gpu
from edgevit.litert.interpreter import load_interpreter
from edgevit.litert.nnapi_rules import check_nnapi
from edgevit.litert.padding import fold_stem_padding, same_kernel_size
from edgevit.litert.piecewise import LEVELS, fit
from edgevit.profile.arm import count_many
from tests.helpers import needs_arm


def layernorm_model():
    inputs = keras.Input((16, 24))
    x = keras.layers.LayerNormalization(epsilon=1e-5)(keras.layers.Dense(24)(inputs))
    return keras.Model(inputs, keras.layers.Dense(8)(x), name="ln")


def run(content, x, kernels="xnnpack"):
    interpreter = load_interpreter(content, kernels=kernels)
    interpreter.allocate_tensors()
    source, sink = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    outputs = []
    for sample in x:
        interpreter.set_tensor(source["index"], sample[None].astype(source["dtype"]))
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(sink["index"])[0])
    return np.array(outputs)


def test_fit_gives_every_level_of_an_int8_rsqrt_table():
    variance = 0.0006 * (LEVELS + 128)              # a calibrated variance grid, zero point -128
    with np.errstate(divide="ignore"):
        exact = 1 / np.sqrt(variance + 1e-5) / 0.075 - 128   # RSQRT output grid: scale 0.075, zero point -128
    function = fit(exact)
    expected = np.clip(np.round(exact), -128, 127)
    np.testing.assert_array_equal(function(LEVELS), expected)
    assert expected[:2].tolist() == [127, 127]      # variance 0 and tiny: the top of the output range
    assert np.all(np.abs(function.weights) <= 127) and len(function.knots) < 120


def test_fit_of_a_constant_and_of_a_saturated_function():
    assert fit(np.full(256, 3.2))(LEVELS).tolist() == [3] * 256
    assert fit(np.full(256, np.inf))(LEVELS).tolist() == [127] * 256


def test_int8_layernorm_is_rsqrt_free_and_nnapi_takes_it_from_android_11(monkeypatch):
    model = layernorm_model()
    rng = np.random.default_rng(1)
    calibration = rng.normal(size=(32, 16, 24)).astype(np.float32)
    content = convert(model, "int8", calibration, "float32")
    ops = [op.name for op in read(content).ops]
    assert "RSQRT" not in ops and ops.count("CONV_2D") == 2
    assert check_nnapi(content, android_api=30).fallbacks == [] and check_gpu(content).fallbacks == []

    monkeypatch.setattr(convert_module, "rsqrt_as_convolutions", lambda content: content)
    with_rsqrt = convert(model, "int8", calibration, "float32")
    assert [(f.op, f.reason) for f in check_nnapi(with_rsqrt, android_api=33).fallbacks] == \
        [("RSQRT", "quantized RSQRT needs Android 14 (NNAPI feature level 7)")]
    assert check_nnapi(with_rsqrt, android_api=34).fallbacks == []

    x = rng.normal(size=(16, 16, 24)).astype(np.float32)
    reference = model.predict(x, verbose=0)
    new, old = run(content, x), run(with_rsqrt, x)

    def cosine(a, b):
        return float(np.mean(np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)))

    # measured: 0.99956 with either formulation, 0.999997 between the two files
    assert cosine(new, reference) >= cosine(old, reference) - 0.0005 > 0.999
    assert cosine(new, old) > 0.9999


@pytest.fixture(scope="module", params=["int8", "int8_mixed"])
def v2_file(request):
    import edgevit

    model = edgevit.create_model("mobilevit_v2_050", num_classes=10, input_size=64)
    calibration = np.random.default_rng(0).random((4, 64, 64, 3), dtype="float32")
    return request.param, convert(model, request.param, calibration)


def test_mobilevit_v2_sum_of_tokens_keeps_its_precision_and_nnapi_takes_the_whole_graph(v2_file):
    precision, content = v2_file
    graph = read(content)
    sums = [op for op in graph.ops if op.name == "MUL" and op.inputs[1].is_const
            and graph.producers.get(op.inputs[0].index) is not None
            and graph.ops[graph.producers[op.inputs[0].index]].name == "MEAN"]
    assert sums
    for mul in sums:
        mean, product = mul.inputs[0], mul.outputs[0]
        count = mul.inputs[1].scale * (int(mul.inputs[1].data[0]) - mul.inputs[1].zero_point)
        assert count > 1 and mean.scale == pytest.approx(product.scale / count, rel=1e-6)
    assert {op.version for op in graph.ops if op.name == "MUL"} == {2}
    assert ("RSQRT" in {op.name for op in graph.ops}) == (precision == "int8_mixed")   # float there
    report = check_nnapi(content, android_api=30)
    assert report.fallbacks == [] and report.partitions == 1


@pytest.mark.parametrize("size, before, after, kernel, stride, expected", [
    (256, 1, 1, 3, 2, 4),     # MobileViT's stem: SAME pads 1 first with a 4x4 kernel
    (255, 1, 1, 3, 2, 3),     # odd inputs: SAME pads one on each side already
    (224, 2, 2, 7, 4, 8),     # CvT's 7x7 stride-4 patch embedding
    (32, 1, 1, 3, 1, 3),      # stride 1: SAME already pads one on each side
    (256, 0, 1, 3, 2, 3),     # TensorFlow's own SAME padding
    (256, 2, 2, 3, 2, None),  # more outputs than SAME gives
    (256, 1, 0, 3, 2, 4),     # the extra tap reads SAME's bottom row
    (256, 2, 0, 3, 2, None),  # SAME never pads more before than after
])
def test_same_kernel_size_reproduces_an_explicit_padding(size, before, after, kernel, stride, expected):
    assert same_kernel_size(size, before, after, kernel, stride) == expected


def padded_stem_model():
    """A PyTorch-padded 3x3 stride-2 stem on RGB, then a padded strided
    depthwise convolution on 8 channels (its PAD must stay)."""
    inputs = keras.Input((64, 64, 3))
    x = keras.layers.Conv2D(8, 3, 2)(keras.layers.ZeroPadding2D(1)(inputs))
    x = keras.layers.DepthwiseConv2D(3, 2)(keras.layers.ZeroPadding2D(1)(keras.layers.Activation("silu")(x)))
    return keras.Model(inputs, x, name="stem")


@pytest.fixture(scope="module")
def stem_files():
    """(what conversion writes, the same conversion without the fold)."""
    model = padded_stem_model()
    calibration = np.random.default_rng(3).random((8, 64, 64, 3), dtype="float32")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(convert_module, "fold_stem_padding", lambda content: content)
        unfolded = convert(model, "int8", calibration, "int8")
    return convert(model, "int8", calibration, "int8"), unfolded


def test_the_image_stems_padding_folds_into_a_bit_identical_same_convolution(stem_files):
    folded, unfolded = stem_files
    assert [op.name for op in read(unfolded).ops] == ["PAD", "CONV_2D", "LOGISTIC", "MUL", "PAD",
                                                     "DEPTHWISE_CONV_2D"]
    assert folded == fold_stem_padding(unfolded)
    ops = read(folded).ops
    assert [op.name for op in ops] == ["CONV_2D", "LOGISTIC", "MUL", "PAD", "DEPTHWISE_CONV_2D"]
    stem = ops[0]
    assert stem.inputs[0].zero_point == -128 and stem.options["padding"] == schema_module().Padding.SAME
    assert stem.inputs[1].shape == (8, 4, 4, 3)
    x = np.random.default_rng(4).integers(-128, 128, (6, 64, 64, 3), dtype=np.int8)
    for kernels in ("xnnpack", "reference"):
        np.testing.assert_array_equal(run(folded, x, kernels), run(unfolded, x, kernels))


@pytest.mark.parametrize("kernel, stride, padding, filters, folded", [
    (3, 2, 1, 16, True),    # MobileViT's stem -> 4x4
    (7, 4, 2, 64, True),    # CvT's -> 8x8
    (7, 4, 3, 64, False),   # a 10x10 would add more taps than the PAD costs
])
def test_a_stems_padding_folds_only_where_the_added_taps_cost_less_than_the_pad(kernel, stride, padding, filters,
                                                                                 folded):
    inputs = keras.Input((64, 64, 3))
    padded = keras.layers.ZeroPadding2D(padding)(inputs)
    model = keras.Model(inputs, keras.layers.Conv2D(filters, kernel, stride)(padded))
    content = convert(model, "int8", np.random.default_rng(5).random((4, 64, 64, 3), dtype="float32"), "int8")
    assert [op.name for op in read(content).ops] == (["CONV_2D"] if folded else ["PAD", "CONV_2D"])


@needs_arm
def test_without_the_stems_pad_the_arm64_xnnpack_kernels_run_fewer_instructions(stem_files, tmp_path):
    """LiteRT 1.4's XNNPACK runs the PAD of a zero point other than 0 on its own."""
    paths = []
    for name, content in zip(("folded", "unfolded"), stem_files):
        paths.append(tmp_path / f"{name}.tflite")
        paths[-1].write_bytes(content)
    (_, folded), (_, unfolded) = count_many(paths, [arm.PROFILES["a76"]], runs=1)
    assert folded.families["pad"] < 0.5 * unfolded.families["pad"]
    assert folded.instructions < 0.8 * unfolded.instructions, (folded.instructions, unfolded.instructions)
