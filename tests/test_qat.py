"""QAT engine: graph rewrite, trained ranges honoured by the converter,
Keras-vs-int8 agreement (acceptance), .keras round trip."""
import keras
import numpy as np
import pytest

from edgevit.errors import EdgevitError
from edgevit.export.agreement import agreement
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.export.run_model import run_in_child
from edgevit.layers import (Fold, LayerNorm, Unfold, conv_norm_act, inverted_residual,
                            separable_attention_block, transformer_encoder)
from edgevit.quantize.layers import (ActivationQuantizer, QuantDense, QuantLayerNorm,
                                     QuantMultiHeadSelfAttention, QuantSeparableSelfAttention)
from edgevit.quantize.qat import calibrate, is_qat_model, quantization_ranges, quantize_model
from edgevit.saving import load_model

SIZE = 32
CLASSES = 3


def tiny_hybrid():
    """Every construct the MobileViT families use, at toy widths: stride-2
    conv + BN + SiLU, inverted residual, v1/v3 block (unfold, LayerNorm,
    multi-head attention, SiLU MLP, fold, concat, fusion, residual add), v2
    block (GroupNorm-style LayerNorm, separable attention), pooling, head."""
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = conv_norm_act(inputs, 16, 3, 2, name="stem")
    x = inverted_residual(x, 16, 1, 2, name="ir")
    shortcut = x
    local = conv_norm_act(x, None, 3, depthwise=True, name="v3.local")
    local = conv_norm_act(local, 32, 1, norm=False, activation=None, use_bias=False, name="v3.proj_in")
    y = Unfold(2, pixels_in_batch=True, name="v3.unfold")(local)
    y = transformer_encoder(y, 32, 64, 2, name="v3.t0")
    y = LayerNorm(name="v3.norm")(y)
    y = Fold((16, 16), 2, pixels_in_batch=True, name="v3.fold")(y)
    y = conv_norm_act(y, 16, 1, name="v3.conv_proj")
    y = keras.layers.Concatenate(name="v3.concat")([local, y])
    y = conv_norm_act(y, 16, 1, name="v3.fusion")
    x = keras.layers.Add(name="v3.add")([y, shortcut])
    x = conv_norm_act(x, 32, 3, 2, name="down")
    y = Unfold(2, pixels_in_batch=False, name="v2.unfold")(x)
    y = separable_attention_block(y, 32, 64, name="v2.t0")
    y = LayerNorm(axes=(1, 2, 3), name="v2.norm")(y)
    x = Fold((8, 8), 2, pixels_in_batch=False, name="v2.fold")(y)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="fc")(x), name="tiny_hybrid")


def synthetic(n, seed):
    """Three classes told apart by colour and stripe direction, in [0, 1]."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    x = rng.uniform(0, 0.4, (n, SIZE, SIZE, 3)).astype(np.float32)
    for i, c in enumerate(labels):
        x[i, ..., c] += 0.5
        if c == 1:
            x[i, ::4] += 0.1
        elif c == 2:
            x[i, :, ::4] += 0.1
    return np.clip(x, 0, 1), labels


@pytest.fixture(scope="module")
def trained():
    """A float model trained to confident logits, its QAT model (ranges
    calibrated, two QAT epochs) and that model's int8 file. Eager training:
    tracing the QAT train step would cost more than the steps."""
    keras.utils.set_random_seed(0)
    x, y = synthetic(128, 0)
    model = tiny_hybrid()
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    qat = quantize_model(model, x[:64], batch_size=32)
    qat.compile(keras.optimizers.Adam(2e-4),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    qat.fit(x, y, batch_size=32, epochs=2, verbose=0)
    return model, qat, convert(qat, "int8", None, "int8")


def predict(model, x):
    return np.concatenate([np.asarray(model(x[i:i + 64], training=False)) for i in range(0, len(x), 64)])


def test_rewrite_folds_batchnorm_and_quantizes_every_internal_op():
    model = tiny_hybrid()
    qat = quantize_model(model)
    kinds = {type(layer).__name__ for layer in qat.layers}
    assert "BatchNormalization" not in kinds
    assert {"QuantConv2D", "QuantDepthwiseConv2D", "QuantDense", "QuantActivation", "QuantLayerNorm",
            "QuantMultiHeadSelfAttention", "QuantSeparableSelfAttention"} <= kinds
    attention = next(layer for layer in qat.layers if isinstance(layer, QuantMultiHeadSelfAttention))
    assert isinstance(attention.qkv, QuantDense) and attention.q_softmax.fixed_range == (0.0, 255 / 256)
    assert sum(isinstance(layer, QuantLayerNorm) for layer in qat.layers) == 6
    assert sum(isinstance(layer, QuantSeparableSelfAttention) for layer in qat.layers) == 1
    assert qat.name == model.name and is_qat_model(qat) and not is_qat_model(model)
    with pytest.raises(EdgevitError, match="already"):
        quantize_model(qat)


def test_batchnorm_folding_keeps_the_function():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 3))
    x = conv_norm_act(inputs, 8, 3, 2, activation=None, name="a")
    x = conv_norm_act(x, None, 3, depthwise=True, activation=None, name="b")
    model = keras.Model(inputs, x, name="convs")
    images = np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype(np.float32)
    from edgevit.models.batchnorm import recalibrate_batchnorm

    recalibrate_batchnorm(model, images)
    qat = quantize_model(model)
    for layer in qat.layers:  # quantizers observe only: what remains is folding + int8 weights
        if isinstance(layer, ActivationQuantizer):
            layer.observing = True
    assert [type(layer).__name__ for layer in qat.layers if "Conv" in type(layer).__name__] == [
        "QuantConv2D", "QuantDepthwiseConv2D"]
    expected = np.asarray(model(images, training=False))
    np.testing.assert_allclose(np.asarray(qat(images, training=False)), expected,
                               atol=0.03 * np.abs(expected).max())


def test_ranges_start_from_calibration_and_ignore_non_finite_values():
    quantizer = ActivationQuantizer(momentum=0.9)
    quantizer.observing = True
    quantizer(np.array([[-1.0, 2.0, np.inf, np.nan]], np.float32))
    quantizer(np.array([[-3.0, 4.0]], np.float32))
    assert float(quantizer.range_min) == pytest.approx(-2.0)   # running mean of the first batches
    assert float(quantizer.range_max) == pytest.approx(3.0)
    quantizer.observing = False
    out = np.asarray(quantizer(np.array([[10.0, -10.0, 0.0]], np.float32)))
    assert out[0, 0] == pytest.approx(3.0, abs=0.03) and out[0, 1] == pytest.approx(-2.0, abs=0.03)
    assert out[0, 2] == 0.0  # zero exactly representable


def test_qat_int8_file_follows_the_keras_model(trained, tmp_path):
    """Acceptance: int8 file with the trained ranges (no representative
    dataset) agrees with the QAT Keras model on held-out images, on the
    LiteRT XNNPACK kernels."""
    _, qat, content = trained
    summary = describe(content)
    assert not summary.float_ops(), "every op must be integer"
    assert summary.input["dtype"] == "int8"
    scale, zero_point = summary.input["quantization"]["scale"], summary.input["quantization"]["zero_point"]
    assert scale == pytest.approx(1 / 255) and zero_point == -128   # the fixed [0, 1] input range
    path = tmp_path / "qat.tflite"
    path.write_bytes(content)
    x, _ = synthetic(200, 7)
    expected = predict(qat, x)
    actual = run_in_child(path, x, num_threads=2)
    result = agreement(expected, actual)
    assert result["top1_agreement"] >= 0.995, result
    assert result["cosine_mean"] >= 0.999, result


def test_trained_ranges_are_the_ranges_in_the_file(trained):
    _, qat, content = trained
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content)
    scales = {round(float(d["quantization"][0]), 7) for d in interp.get_tensor_details()
              if d["dtype"] == np.int8 and d["quantization"][0] > 0}
    ranges = quantization_ranges(qat)
    expected = {round((hi - lo) / 255, 7) for lo, hi in ranges.values()}
    kept = len(expected & scales) / len(expected)
    assert kept > 0.9, f"only {kept:.0%} of the trained ranges appear as tensor scales"
    assert round(1 / 256, 7) in scales   # fixed softmax / sigmoid output range


def test_qat_model_saves_and_reloads_with_identical_outputs(trained, tmp_path):
    _, qat, _ = trained
    path = tmp_path / "tiny_qat.keras"
    qat.save(path)
    reloaded = keras.saving.load_model(path, compile=False)
    x, _ = synthetic(8, 3)
    assert is_qat_model(reloaded)
    np.testing.assert_array_equal(predict(reloaded, x), predict(qat, x))
    assert quantization_ranges(reloaded) == quantization_ranges(qat)


def test_conversion_without_calibration_needs_a_qat_model():
    with pytest.raises(EdgevitError, match="needs calibration images"):
        convert(tiny_hybrid(), "int8", None, "int8")


def test_calibrate_needs_images():
    qat = quantize_model(tiny_hybrid())
    with pytest.raises(EdgevitError, match="No images"):
        calibrate(qat, [])


def test_load_model_rejects_a_keras_file_that_is_not_an_edgevit_model(tmp_path):
    path = tmp_path / "other.keras"
    tiny_hybrid().save(path)
    with pytest.raises(EdgevitError, match="not an edgevit model"):
        load_model(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilevit_v1_xxs", "mobilevit_v2_050", "mobilevit_v3_xxs", "mobilevit_v3_050"])
def test_every_family_converts_with_trained_ranges(name):
    from edgevit.data import sample_photos
    from edgevit.models.batchnorm import recalibrate_batchnorm
    from edgevit.registry import create_model, get_spec

    model = create_model(name, num_classes=10, input_size=64)
    images = sample_photos.sample_batch(get_spec(name).preprocessing_at(64), 16)
    recalibrate_batchnorm(model, images)
    content = convert(quantize_model(model, images), "int8", None, "int8")
    assert not describe(content).float_ops()
