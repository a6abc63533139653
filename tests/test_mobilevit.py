"""MobileViT v1/v2/v3: exact sizes, any input size, serialisation, and the
deployment rules on converted files."""
from collections import Counter

import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS, convert
from edgevit.export.graph import describe
from edgevit.info import count_params
from edgevit.litert.flatbuffer import read
from edgevit.litert.nnapi_rules import check_nnapi
from edgevit.litert.xnnpack import xnnpack_plan
from edgevit.registry import get_spec
from tests.helpers import assert_deployable, export_variant, round_trip_outputs

# Trainable parameters of the official implementations (1000 classes).
OFFICIAL_PARAMS = {
    "mobilevit_v1_xxs": 1_272_024, "mobilevit_v1_xs": 2_317_848, "mobilevit_v1_s": 5_578_632,
    "mobilevit_v2_050": 1_370_593, "mobilevit_v2_075": 2_866_009, "mobilevit_v2_100": 4_901_841,
    "mobilevit_v2_125": 7_478_089, "mobilevit_v2_150": 10_594_753, "mobilevit_v2_175": 14_251_833,
    "mobilevit_v2_200": 18_449_329,
    "mobilevit_v3_xxs": 1_249_448, "mobilevit_v3_xs": 2_490_360, "mobilevit_v3_s": 5_763_912,
    "mobilevit_v3_xxs_l2": 1_145_288, "mobilevit_v3_xs_l2": 2_257_320, "mobilevit_v3_s_l2": 5_169_864,
    "mobilevit_v3_050": 1_429_985, "mobilevit_v3_075": 2_999_641, "mobilevit_v3_100": 5_139_409,
}
SMALLEST = ["mobilevit_v1_xxs", "mobilevit_v2_050", "mobilevit_v3_xxs", "mobilevit_v3_050"]
SMALL_SIZE = 64


def test_registry_holds_exactly_the_mobilevit_variants():
    assert edgevit.list_models("mobilevit*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
def test_parameter_count_equals_official(name):
    model = edgevit.create_model(name, input_size=SMALL_SIZE)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 256


@pytest.mark.parametrize("name", SMALLEST)
@pytest.mark.parametrize("size", [96, 224])
def test_any_multiple_of_32_builds_and_runs(name, size):
    """224 puts layer 5 on a 7x7 map, off the 2x2 patch grid (resize path)."""
    model = edgevit.create_model(name, num_classes=7, input_size=size)
    out = model.predict(np.random.default_rng(0).random((2, size, size, 3), dtype="float32"), verbose=0)
    assert out.shape == (2, 7) and np.isfinite(out).all()


@pytest.mark.parametrize("name", ["mobilevit_v3_xxs", "mobilevit_v3_050"])
def test_keras_file_round_trip_is_identical(tmp_path, name):
    model = edgevit.create_model(name, num_classes=5, input_size=SMALL_SIZE)
    x = np.random.default_rng(1).random((2, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    round_trip_outputs(tmp_path, model, x)


# Every precision of the headline family's smallest; full int8 of the other two generations. The rest of this
# model-by-precision matrix (about 4 minutes on 2 cores) runs with -m slow.
PRECISION_MATRIX = [pytest.param(name, precision, id=f"{precision}-{name}",
                                 marks=() if name == "mobilevit_v3_xxs" or precision == "int8" else pytest.mark.slow)
                    for name in SMALLEST[:3] for precision in PRECISIONS]


@pytest.mark.parametrize(("name", "precision"), PRECISION_MATRIX)
def test_smallest_variant_converts_in_every_precision(tmp_path, name, precision):
    report = export_variant(tmp_path, name, precision, SMALL_SIZE)
    assert_deployable(report)
    agreement = report["agreement"]
    # Random-init weights (BatchNorm re-estimated) give tiny, noise-like
    # logits, the worst case for quantization; trained weights do better.
    # Floors sit below the lowest of seeds 0-3 (int16x8 0.970, int8 0.789).
    floor = {"fp32": 0.9999, "fp16": 0.999, "dynamic": 0.99, "int16x8": 0.95}.get(precision, 0.75)
    assert agreement["cosine_mean"] > floor, agreement


def test_int8_attention_and_layernorm_run_in_integer_ops(tmp_path):
    """The whole transformer path (LayerNorm, softmax, SiLU, attention matmuls)
    is int8 in --int8 output; int8_mixed leaves only the attention matmuls, softmax, LayerNorm's 1/sqrt and the stem in
    float, and XNNPACK takes every op of it in one partition."""
    model = edgevit.create_model("mobilevit_v3_xxs", num_classes=10, input_size=SMALL_SIZE)
    calib = np.random.default_rng(0).random((4, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    int8_content = convert(model, "int8", calib, "int8")
    int8 = describe(int8_content)
    assert int8.float_ops() == []
    assert {"BATCH_MATMUL", "SOFTMAX", "LOGISTIC"} <= set(int8.op_histogram) and "RSQRT" not in int8.op_histogram
    content = convert(model, "int8_mixed", calib, "float32")
    mixed = describe(content)
    float_compute = Counter(op.name for op in mixed.float_ops(allow_io_boundary=True)
                            if op.name not in ("QUANTIZE", "DEQUANTIZE"))
    # LayerNorm's RSQRT and its variance + epsilon ADD stay float: XNNPACK has no int8 RSQRT and refuses an
    # int8 ADD of a constant whose scale is ~1e-7 of the other operand's
    # and the stem, a 3x3 convolution of the RGB image (27 values per output: int8 gains nothing), with its SiLU
    assert set(float_compute) == {"BATCH_MATMUL", "SOFTMAX", "RSQRT", "ADD", "PAD", "CONV_2D", "LOGISTIC", "MUL"}
    assert float_compute["ADD"] == float_compute["RSQRT"] > 0
    assert float_compute["PAD"] == float_compute["CONV_2D"] == float_compute["LOGISTIC"] == float_compute["MUL"] == 1
    first_conv = next(op for op in read(content).ops if op.name == "CONV_2D")
    assert first_conv.outputs[0].dtype == "float32" and first_conv.inputs[1].shape == (16, 3, 3, 3)
    plan = xnnpack_plan(content)
    assert plan.whole_graph, (plan.partitions, plan.builtin_ops)
    # full int8: keys and values on zero-point-0 grids, so XNNPACK runs every int8 BATCH_MATMUL; LayerNorm's
    # RSQRT and epsilon ADD are two convolutions; only SOFTMAX has no XNNPACK kernel in int8
    matmuls = [op for op in read(int8_content).ops if op.name == "BATCH_MATMUL"]
    assert matmuls and all(op.inputs[1].zero_point == 0 for op in matmuls)
    assert set(xnnpack_plan(int8_content).builtin_ops) == {"SOFTMAX"}
    # NNAPI from Android 13, where it has BATCH_MATMUL: the whole graph
    assert check_nnapi(int8_content, android_api=33).fallbacks == []


def test_v2_separable_attention_has_no_activation_matmul(tmp_path):
    model = edgevit.create_model("mobilevit_v2_050", num_classes=10, input_size=SMALL_SIZE)
    content = convert(model, "fp32")
    hist = describe(content).op_histogram
    assert "BATCH_MATMUL" not in hist and "TRANSPOSE" in hist
    # no uneven SPLIT_V of the query/key/value channels and no RELU of its own (fused into the values'
    # FULLY_CONNECTED): XNNPACK has no SPLIT_V and no standalone int8 RELU
    assert "SPLIT_V" not in hist and "RELU" not in hist and xnnpack_plan(content).whole_graph
    calib = np.random.default_rng(0).random((4, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    assert xnnpack_plan(convert(model, "int8_mixed", calib)).whole_graph


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    report = export_variant(tmp_path, name, precision, 256)
    assert_deployable(report)
