"""QAT engine: graph rewrite, the class-keyed registry, trained ranges
honoured by the converter, Keras-vs-int8 agreement (acceptance, and exact
op by op on the kernels users ship), .keras round trip, and every family
through QAT on a small folder of real photos."""
import subprocess
import sys
import textwrap
from collections import Counter

import keras
import numpy as np
import pytest
import tensorflow as tf

import edgevit
from edgevit.data.folders import find_dataset
from edgevit.data.stream import ImageStream
from edgevit.errors import EdgevitError
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.layers import (
    Fold,
    HeadAttention,
    LayerNorm,
    TokenSlice,
    Unfold,
    conv_norm_act,
    inverted_residual,
    separable_attention_block,
    transformer_encoder,
)
from edgevit.litert.agreement import agreement
from edgevit.litert.flatbuffer import read
from edgevit.litert.run_model import run_in_child
from edgevit.litert.xnnpack import xnnpack_plan
from edgevit.models.t2t_vit import TokenPerformer
from edgevit.quantize.conv_dense_layers import QuantDense
from edgevit.quantize.kernel_arithmetic import targeting_kernels
from edgevit.quantize.multi_op_layers import QuantLayerNorm, QuantMultiHeadSelfAttention, QuantSeparableSelfAttention
from edgevit.quantize.qat import calibrate, is_qat_model, per_channel_weights, quantization_ranges, quantize_model
from edgevit.quantize.quantizers import ActivationQuantizer
from edgevit.quantize.registry import QuantizeRule, register
from edgevit.registry import get_spec
from edgevit.saving import load_model
from tests.helpers import FEW_BLOCKS, SMALLEST, needs_arm, outputs, with_few_blocks

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


def test_ranges_start_from_calibration_and_leave_out_batches_with_non_finite_values():
    quantizer = ActivationQuantizer(momentum=0.9)
    quantizer.observing = True
    quantizer(np.array([[-1.0, 2.0]], np.float32))
    quantizer(np.array([[-5.0, 9.0, np.inf, np.nan]], np.float32))
    quantizer(np.array([[-3.0, 4.0]], np.float32))
    lo, hi = quantizer.quantization_range()
    assert float(lo) == pytest.approx(-2.0) and float(hi) == pytest.approx(3.0)  # mean of the finite batches
    assert float(quantizer.batches_seen[0]) == 0.0  # stored once calibration ends
    quantizer.observing = False
    assert float(quantizer.batches_seen[0]) == 2.0
    out = np.asarray(quantizer(np.array([[10.0, -10.0, 0.0]], np.float32)))
    assert out[0, 0] == pytest.approx(3.0, abs=0.03) and out[0, 1] == pytest.approx(-2.0, abs=0.03)
    assert out[0, 2] == 0.0  # zero exactly representable


def test_tensors_sharing_a_quantizer_get_the_union_of_their_ranges():
    quantizer = ActivationQuantizer(momentum=0.9, slots=2)
    quantizer.observing = True
    quantizer(np.array([[-1.0, 0.5]], np.float32), slot=0)
    quantizer(np.array([[0.0, 4.0]], np.float32), slot=1)
    lo, hi = quantizer.quantization_range()
    assert (float(lo), float(hi)) == pytest.approx((-1.0, 4.0))


def test_performer_gradients_in_qat_are_those_of_the_float_performer():
    """Keys and queries of a trained scale (T2T-ViT-7 at 64 px: exponents
    from -87 to 14) put most int8 normalisers at zero. The rounded chain's
    own gradient through RSQRT and EXP then grew 200-fold here, and was
    infinite in a real QAT run; the float chain's stays close to the float
    model's."""
    keras.utils.set_random_seed(0)
    tokens = np.random.default_rng(0).standard_normal((4, 64, 27)).astype("float32")
    inputs = keras.Input((64, 27), name="tokens")
    performer = TokenPerformer(16, dropout=0.0, name="performer")
    pooled = keras.layers.GlobalAveragePooling1D()(performer(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(pooled))
    performer.kqv.kernel.assign(performer.kqv.kernel * 20.0)
    qat = quantize_model(model, tokens)

    def gradient_norms(m):
        with tf.GradientTape() as tape:
            logits = m(tokens, training=True)
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(np.arange(4) % 2, logits)
        return {v.path: float(tf.norm(g)) for v, g in zip(m.trainable_variables,
                                                           tape.gradient(loss, m.trainable_variables))}

    float_norms = gradient_norms(model)
    ratios = {path: norm / float_norms[path] for path, norm in gradient_norms(qat).items()
              if path.startswith("performer/") and path.endswith("kernel")}
    assert ratios and all(0.1 < r < 10.0 for r in ratios.values()), ratios


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
    # keys and values train on zero-point-0 grids, so XNNPACK runs the attention matmuls
    assert all(op.inputs[1].zero_point == 0 for op in read(content).ops if op.name == "BATCH_MATMUL")
    assert "BATCH_MATMUL" not in xnnpack_plan(content).builtin_ops
    path = tmp_path / "qat.tflite"
    path.write_bytes(content)
    x, _ = synthetic(200, 7)
    expected = outputs(qat, x)
    actual = run_in_child(path, x, num_threads=2)
    result = agreement(expected, actual)
    assert result["top1_agreement"] >= 0.995, result
    assert result["cosine_mean"] >= 0.999, result



@pytest.mark.parametrize("precision, cosine", [("fp32", 0.99999), ("fp16", 0.9999), ("dynamic", 0.99)])
def test_float_files_of_a_qat_model_compute_in_float(trained, tmp_path, precision, cosine):
    """A float precision converts the QAT model without its fake quantization
    (it was left in: a QUANTIZE and a DEQUANTIZE per quantizer in "fp32",
    an int8 graph with float input and output in "fp16" and "dynamic")."""
    from edgevit.export.pipeline import keras_outputs

    _, qat, _ = trained
    content = convert(qat, precision)
    assert "QUANTIZE" not in {op.name for op in read(content).ops}
    assert describe(content).input["dtype"] == "float32"
    path = tmp_path / "float.tflite"
    path.write_bytes(content)
    x, _ = synthetic(32, 7)
    result = agreement(keras_outputs(qat, x, fake_quant=False), run_in_child(path, x))
    assert result["cosine_min"] >= cosine, result

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


def test_a_training_step_computes_the_same_eagerly_and_in_a_graph(trained):
    """Eagerly, ranges are computed in numpy; `edgevit qat` trains in a
    graph, where they are ops on the variables (traced without AutoGraph, as
    the Trainer traces it): same outputs, same ranges."""
    import tensorflow as tf

    _, qat, _ = trained
    x, _ = synthetic(16, 5)
    before = {id(v): np.asarray(v) for v in qat.variables}
    results = []
    for forward in (qat, tf.function(qat, autograph=False)):
        trained_outputs = np.asarray(forward(x, training=True))
        results.append((trained_outputs, [np.asarray(v) for v in qat.non_trainable_variables]))
        for variable in qat.variables:
            variable.assign(before[id(variable)])
    (eager, eager_ranges), (graph, graph_ranges) = results
    np.testing.assert_array_equal(eager, graph)
    for eager_range, graph_range in zip(eager_ranges, graph_ranges):
        np.testing.assert_array_equal(eager_range, graph_range)
    moved = [not np.array_equal(r, before[id(v)]) for v, r in zip(qat.non_trainable_variables, eager_ranges)]
    assert sum(moved) > 10  # the step did track ranges


def test_qat_model_saves_and_reloads_with_identical_outputs(trained, tmp_path):
    _, qat, _ = trained
    path = tmp_path / "tiny_qat.keras"
    qat.save(path)
    reloaded = keras.saving.load_model(path, compile=False)
    x, _ = synthetic(8, 3)
    assert is_qat_model(reloaded)
    np.testing.assert_array_equal(outputs(reloaded, x), outputs(qat, x))
    assert quantization_ranges(reloaded) == quantization_ranges(qat)


# What a saved QAT .keras file calls each layer class: every release's files
# load only while each of these names resolves.
SAVED_CLASS_NAMES = sorted(f"edgevit.qat>{name}" for name in (
    "ActivationQuantizer", "ConstantQuantizer", "QuantActivation", "QuantAffine", "QuantAverage",
    "QuantBicubicResize", "QuantConv2D", "QuantCosineWindowAttention", "QuantDense", "QuantDepthwiseConv2D",
    "QuantGatedPositionalSelfAttention", "QuantHeadAttention", "QuantLayerNorm", "QuantLayerScale",
    "QuantMultiHeadSelfAttention", "QuantPositionEmbedding", "QuantReAttention", "QuantSeparableSelfAttention",
    "QuantTokenAttention", "QuantTokenPerformer", "QuantWindowAttention"))


def test_a_fresh_process_loads_a_qat_file_by_the_names_saved_files_hold(tmp_path):
    """Loading resolves each layer class by the name the file holds, not by
    the module that defines it: a fresh process (the command line's) that
    imports only edgevit.saving loads a QAT file with identical outputs, and
    then knows every name saved files use, and no other."""
    x = np.random.default_rng(1).random((2, 64, 64, 3), dtype="float32")
    qat = quantize_model(edgevit.create_model("mobilevit_v2_050", num_classes=2, input_size=64), x)
    path = tmp_path / "mobilevit_v2_050_qat.keras"
    qat.save(path)
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent("""
        import sys
        import keras
        import numpy as np
        from edgevit.saving import load_model
        model = load_model(sys.argv[1])
        np.save(sys.argv[3], np.asarray(model(np.load(sys.argv[2]), training=False)))
        print(sorted(name for name in keras.saving.get_custom_objects() if name.startswith("edgevit.qat>")))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(SAVED_CLASS_NAMES)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), outputs(qat, x))


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


class Doubling(keras.layers.Layer):
    """A layer class the QAT registry has no entry for."""

    def call(self, x):
        return x * 2.0


def test_a_layer_class_without_a_registry_entry_is_a_named_error():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(Doubling(name="twice")(inputs)))
    with pytest.raises(EdgevitError, match=r"no rule for layer class .*test_qat\.Doubling \(layer 'twice'\)"):
        quantize_model(model)
    register(Doubling, QuantizeRule("output"))
    assert is_qat_model(quantize_model(model))


def test_a_layer_used_by_two_token_groups_shares_its_weights_and_has_ranges_per_call():
    """One LayerNorm over a class-token group and a patch group (as in every
    ViT-style block) used to fail with 'name used 2 times'."""
    inputs = keras.Input((5, 8))
    cls, patches = TokenSlice(0, 1, name="cls")(inputs), TokenSlice(1, name="patches")(inputs)
    norm = LayerNorm(name="norm")
    x = keras.layers.Concatenate(axis=1, name="join")([norm(cls), norm(patches)])
    qat = quantize_model(keras.Model(inputs, keras.layers.Dense(3, name="fc")(x), name="groups"))
    norms = [layer for layer in qat.layers if isinstance(layer, QuantLayerNorm)]
    assert len(norms) == 1 and len(norms[0].weights) > 2
    ranges = quantization_ranges(qat)
    assert "norm/q_mean" in ranges and "norm/q1_mean" in ranges
    # the model's output "fc" is rounded after the Dense: its quantization-aware form is "fc.computed"
    assert "fc.computed.kernel" not in per_channel_weights(qat) and "fc.computed/kernel" in per_channel_weights(qat)


def test_concatenated_tensors_share_one_scale_and_need_no_requantization():
    """LiteRT keeps a CONCATENATION's inputs and output at one scale: with
    ranges of their own the converter would requantize some of them."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4, 4, 3), name="image")
    a = keras.layers.Conv2D(4, 1, name="a")(inputs)
    b = keras.layers.Conv2D(4, 1, name="b")(inputs)
    x = keras.layers.Concatenate(name="join")([a, b])
    model = keras.Model(inputs, keras.layers.Conv2D(2, 1, name="c")(x), name="joined")
    images = np.random.default_rng(0).uniform(0, 1, (8, 4, 4, 3)).astype(np.float32)
    qat = quantize_model(model, images)
    graph = read(convert(qat, "int8", None, "int8"))
    assert "QUANTIZE" not in {op.name for op in graph.ops[1:]}
    concat = next(op for op in graph.ops if op.name == "CONCATENATION")
    assert len({(t.scale, t.zero_point) for t in [*concat.inputs, *concat.outputs]}) == 1


def test_a_qat_model_keeps_its_output_names_through_saving_and_conversion(tmp_path):
    """A detector's outputs are named "boxes" and "scores" (the concatenations
    that write them); its QAT copy rounds them with the heads' shared
    quantizers and keeps the names, saved and loaded, and its int8 file
    names its outputs as the float model's file does."""
    from ai_edge_litert.interpreter import Interpreter

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4, 4, 3), name="image")
    levels = [inputs, keras.layers.AveragePooling2D(2, name="half")(inputs)]
    parts = [[keras.layers.Reshape((-1, width), name=f"{name}{i}.reshape")(
        keras.layers.Conv2D(width, 1, name=f"{name}{i}")(level)) for i, level in enumerate(levels)]
        for name, width in (("box", 4), ("class", 3))]
    model = keras.Model(inputs, [keras.layers.Concatenate(axis=1, name=name)(p)
                                 for name, p in zip(("boxes", "scores"), parts)], name="two_level_detector")
    images = np.random.default_rng(0).uniform(0, 1, (8, 4, 4, 3)).astype(np.float32)
    qat = quantize_model(model, images)
    assert qat.output_names == ["boxes", "scores"]
    assert {"boxes.computed", "scores.computed"} <= {layer.name for layer in qat.layers}
    qat.save(tmp_path / "detector.keras")
    reloaded = keras.saving.load_model(tmp_path / "detector.keras", compile=False)
    assert reloaded.output_names == ["boxes", "scores"]
    for saved, loaded in zip(qat(images), reloaded(images)):
        np.testing.assert_array_equal(loaded, saved)

    def named_outputs(content):
        interp = Interpreter(model_content=content)
        return [d["name"] for d in interp.get_output_details()], interp.get_signature_list()

    assert named_outputs(convert(reloaded, "int8", None, "float32")) == \
        named_outputs(convert(model, "fp32", None, "float32"))



@pytest.fixture(scope="module")
def attention_qat(tmp_path_factory):
    """A QAT model of a LayerNorm over two token groups, concatenated, then
    multi-head attention; its inputs and int8 file."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6, 16), name="tokens")
    norm = LayerNorm(name="norm")
    groups = [TokenSlice(0, 1, name="cls")(inputs), TokenSlice(1, name="patches")(inputs)]
    x = keras.layers.Concatenate(axis=1, name="join")([norm(g) for g in groups])
    q, k, v = (keras.layers.Dense(16, name=n)(x) for n in ("q", "k", "v"))
    y = keras.layers.Dense(4, name="proj")(HeadAttention(2, name="heads")([q, k, v]))
    model = keras.Model(inputs, y, name="attention")
    for w in model.weights:  # trained-like: no all-one scales or zero biases the converter would fold away
        w.assign(np.asarray(w) + np.random.default_rng(1).normal(0, 0.1, w.shape).astype(np.float32))
    x = np.random.default_rng(2).normal(0, 1, (64, 6, 16)).astype(np.float32)
    qat = quantize_model(model, x, input_range=(-4.0, 4.0))
    path = tmp_path_factory.mktemp("qat") / "attention.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    return qat, x, path


@pytest.fixture(scope="module")
def convnet_qat(tmp_path_factory):
    """A QAT model of a convolution + BN + SiLU, a residual ADD with a 1x1
    convolution, a depthwise convolution and a dense head; its inputs and int8 file."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((16, 16, 8), name="features")
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = keras.layers.Activation("silu", name="act")(keras.layers.BatchNormalization(name="bn")(x))
    x = keras.layers.Add(name="residual")([x, keras.layers.Conv2D(16, 1, name="pointwise")(x)])
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    model = keras.Model(inputs, keras.layers.Dense(8, name="head")(x), name="convnet")
    x = np.random.default_rng(2).normal(0, 1, (64, 16, 16, 8)).astype(np.float32)
    qat = quantize_model(model, x, input_range=(-4.0, 4.2))
    path = tmp_path_factory.mktemp("qat") / "convnet.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    return qat, x, path


def test_int8_file_computes_exactly_what_the_qat_model_computes(attention_qat):
    """Every logit of the int8 file equals the QAT model's, on LiteRT's
    XNNPACK kernels: the int32 biases, the two-step rounding of int8
    BATCH_MATMUL and the concat of two token groups are modelled."""
    qat, x, path = attention_qat
    np.testing.assert_allclose(run_in_child(path, x), outputs(qat, x), atol=1e-5)  # an int8 step: 0.02


def test_int8_file_computes_exactly_what_a_convolutional_qat_model_computes(convnet_qat):
    """Every output of a small convolutional QAT model equals its int8
    file's on XNNPACK: convolution and dense accumulators and MUL products
    are requantized with XNNPACK's float32 scale, ADDs with its fixed-point
    multipliers (a float fake-quant of the same values rounds the other way
    near rounding midpoints, and each such step spreads to later layers)."""
    qat, x, path = convnet_qat
    np.testing.assert_array_equal(run_in_child(path, x), outputs(qat, x))


def relu_convnet_qat(folder):
    """A QAT model whose ReLU and ReLU6 the converter fuses into the ops
    before them: a convolution + BN + ReLU layer, a convolution and a dense
    layer with their own ReLU6 / ReLU; its inputs and int8 file."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((16, 16, 8), name="features")
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = keras.layers.Activation("relu", name="act")(keras.layers.BatchNormalization(name="bn")(x))
    x = keras.layers.Conv2D(16, 1, activation="relu6", name="pointwise")(x)
    model = keras.Model(inputs, keras.layers.Dense(8, activation="relu", name="head")(x), name="relu_convnet")
    for w in model.weights:  # trained-like
        w.assign(np.asarray(w) + np.random.default_rng(1).normal(0, 0.1, w.shape).astype(np.float32))
    x = np.random.default_rng(2).normal(0, 1, (16, 16, 16, 8)).astype(np.float32)
    qat = quantize_model(model, x, input_range=(-4.0, 4.2))
    path = folder / "relu_convnet.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    return qat, x, path


def test_a_relu_fused_into_the_op_before_it_rounds_once_as_the_int8_file_does(tmp_path, monkeypatch):
    """LiteRT's converter fuses a ReLU or ReLU6 into the convolution or
    dense layer before it: one rounding onto the activation's grid. The QAT
    model gives the tensor before such an activation no range of its own,
    and every output equals the int8 file's; with a range of its own (the
    rewrite before, here by emptying FUSED_ACTIVATIONS) the accumulator is
    rounded twice and outputs differ (DeepViT's ReLU stem: 13 of 16 logits)."""
    from edgevit.quantize import qat as rewrite

    qat, x, path = relu_convnet_qat(tmp_path)
    names = {layer.name for layer in qat.layers}
    assert "bn.quant" not in names and "pointwise.quant" not in names and "head.quant" not in names
    assert {"act.act.quant", "pointwise.act.quant", "head.act.quant"} <= names
    np.testing.assert_array_equal(run_in_child(path, x), outputs(qat, x))
    monkeypatch.setattr(rewrite, "FUSED_ACTIVATIONS", ())
    (tmp_path / "twice").mkdir()
    qat, x, path = relu_convnet_qat(tmp_path / "twice")
    assert "bn.quant" in {layer.name for layer in qat.layers}
    assert not np.array_equal(run_in_child(path, x), outputs(qat, x))


def test_a_global_average_over_one_position_keeps_its_input_scale_as_the_int8_file_does(tmp_path):
    """The converter drops a MEAN over a 1x1 map (a detector's pooled level
    at 256 px and less): the convolution after it reads the tensor before
    it. The QAT model gives that pooling no range of its own, and every
    output equals the int8 file's (with a range of its own, 2 % of a
    trained detector's pooled-level outputs were a step off)."""
    keras.utils.set_random_seed(6)
    inputs = keras.Input((2, 2, 8), name="features")
    x = keras.layers.Conv2D(16, 2, activation="relu", name="reduce")(inputs)
    x = keras.layers.GlobalAveragePooling2D(keepdims=True, name="pool")(x)
    model = keras.Model(inputs, keras.layers.Conv2D(8, 1, use_bias=False, name="proj")(x), name="pooled_level")
    x = np.random.default_rng(2).normal(0, 1, (64, 2, 2, 8)).astype(np.float32)
    qat = quantize_model(model, x, input_range=(-4.0, 4.2))
    path = tmp_path / "pooled_level.tflite"
    path.write_bytes(convert(qat, "int8", None, "int8"))
    assert "pool.quant" not in {layer.name for layer in qat.layers}
    assert "MEAN" not in {op.name for op in read(path.read_bytes()).ops}
    np.testing.assert_array_equal(run_in_child(path, x), outputs(qat, x))


@needs_arm
def test_on_arm64_kernels_the_int8_files_compute_what_the_qat_models_compute(trained, attention_qat, convnet_qat,
                                                                              tmp_path):
    """The same promise on the phone's CPU kernels: LiteRT's Arm64 XNNPACK
    (LiteRT 1.4 aarch64, emulated), with the dotprod kernels of a Cortex-A76
    and the i8mm kernels. Convolutions, dense layers, SiLU, MUL and ADD: every
    output exact, as on x86; the trained model: the x86 acceptance bounds.
    The attention model, its QAT model targeting "arm64" kernels: exact as
    well. Its int8 SOFTMAX and both BATCH_MATMULs round otherwise on Arm64:
    the scores' (second operand with a zero point) runs in TFLite's builtin
    kernel, whose aarch64 build (ruy) rounds the accumulator times a 31-bit
    multiplier once where x86's rounds twice, and the context's in
    XNNPACK's aarch64 GEMM ("rndnu"). (Measured with Arm64's SOFTMAX and
    x86's BATCH_MATMUL rounding: 35 of 1,536 outputs up to 2 steps off.)"""
    from edgevit.litert.arm import PROFILES, find_emulator, parallel, run_guest

    _, qat, content = trained
    path = tmp_path / "qat.tflite"
    path.write_bytes(content)
    held_out, _ = synthetic(200, 7)

    def acceptance(actual, expected, where):
        result = agreement(expected, actual)
        assert result["top1_agreement"] >= 0.995 and result["cosine_mean"] >= 0.999, (where, result)

    def exact(actual, expected, where):
        np.testing.assert_array_equal(actual, expected, err_msg=where)

    with targeting_kernels("arm64"):
        expected_on_arm64 = outputs(attention_qat[0], attention_qat[1])
    cases = [(path, held_out, outputs(qat, held_out), acceptance),
             (attention_qat[2], attention_qat[1], expected_on_arm64, exact),
             (convnet_qat[2], convnet_qat[1], outputs(convnet_qat[0], convnet_qat[1]), exact)]
    emulator = find_emulator()
    jobs = [(case, profile) for case in cases for profile in (PROFILES["a76"], PROFILES["max"])]
    runs = parallel(lambda job: run_guest(emulator, job[0][0], job[0][1], job[1]).outputs["xnnpack"], jobs)
    for ((file, _, expected, holds), profile), actual in zip(jobs, runs):
        holds(actual, expected, f"{file.name} on {profile.name}")


def test_every_family_has_its_smallest_variant_here():
    """Every classifier family (the segmenters' QAT runs on masks: tests/test_segmentation_training.py)."""
    families = {get_spec(name).family for name in edgevit.list_models() if get_spec(name).task == "classification"}
    assert families == {get_spec(name).family for name in SMALLEST}


@pytest.mark.parametrize("name", list(SMALLEST))
def test_every_family_trains_saves_and_converts_with_trained_ranges(name, photos, tmp_path, monkeypatch):
    if name in FEW_BLOCKS:
        with_few_blocks(name, monkeypatch)
    size = SMALLEST[name]
    pre = get_spec(name).preprocessing_at(size)
    dataset = find_dataset(photos)
    x, y = ImageStream(dataset.train, pre).read_all(size)
    model = edgevit.create_model(name, num_classes=2, input_size=size)
    qat = quantize_model(model, x, input_range=pre.value_range)
    qat.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                run_eagerly=True)
    qat.fit(x, y, batch_size=len(x), epochs=1, verbose=0)  # one step: eager steps are slow
    qat.save(tmp_path / f"{name}_qat.keras")
    reloaded = load_model(tmp_path / f"{name}_qat.keras")
    np.testing.assert_array_equal(outputs(reloaded, x[:2]), outputs(qat, x[:2]))
    content = convert(reloaded, "int8", None, "int8")
    summary = describe(content)
    assert not summary.float_ops(), [op.name for op in summary.float_ops()]
    assert summary.input["dtype"] == "int8" and "QUANTIZE" not in summary.op_histogram
    # what the class tokens compute before meeting the image is folded into constants
    assert not [op.name for op in read(content).ops if all(t is None or t.is_const for t in op.inputs)]


def test_int8_mixed_conversion_of_a_qat_model_keeps_attention_and_rsqrt_in_float(trained):
    _, qat, _ = trained
    content = convert(qat, "int8_mixed", None)
    float_ops = Counter(op.name for op in describe(content).float_ops(allow_io_boundary=True)
                        if op.name not in ("QUANTIZE", "DEQUANTIZE"))
    assert set(float_ops) == {"BATCH_MATMUL", "SOFTMAX", "RSQRT", "ADD"}
    assert float_ops["ADD"] == float_ops["RSQRT"]   # LayerNorm's variance + epsilon
    # XNNPACK runs the attention matmuls and the LayerNorms; the v2 block's softmax over the patches, which
    # only post-training --int8-mixed can dequantize around, stays on the builtin kernels
    builtin = xnnpack_plan(content).builtin_ops
    assert not {"BATCH_MATMUL", "RSQRT", "RELU"} & set(builtin) and builtin["SOFTMAX"] == 1, builtin


def test_eval_runs_a_qat_model_eagerly_where_tracing_it_would_cost_more():
    from edgevit.data.stream import BATCH_SIZE
    from edgevit.evaluate import QAT_TRACE_IN_EAGER_BATCHES, keras_forward

    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, use_bias=False)(inputs)
    x = keras.layers.Activation("relu")(keras.layers.BatchNormalization()(x))
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(x)))
    qat = quantize_model(model)
    few = QAT_TRACE_IN_EAGER_BATCHES * BATCH_SIZE

    def traced(forward):
        return hasattr(getattr(forward, "graph_function", forward), "get_concrete_function")

    assert not traced(keras_forward(qat, few)) and traced(keras_forward(qat, few + 1))
    assert traced(keras_forward(model, 1))


def test_a_training_run_evaluates_the_fake_quant_graph_and_eval_the_exact_one(trained):
    """`edgevit qat` validates on the fake-quant ops alone (val_metrics with
    kernel_arithmetic=False); `edgevit eval` and inference compute LiteRT's
    integer arithmetic."""
    from edgevit.quantize.export_trace import fake_quant_only
    from edgevit.train.metrics import traced_forward

    _, qat, _ = trained
    x, _ = synthetic(16, 7)
    exact = np.asarray(qat(x, training=False))
    with fake_quant_only():
        fake = np.asarray(qat(x, training=False))
    np.testing.assert_array_equal(np.asarray(traced_forward(qat)(x)), exact)
    np.testing.assert_array_equal(np.asarray(traced_forward(qat, kernel_arithmetic=False)(x)), fake)
    assert not np.array_equal(exact, fake)  # the integer arithmetic rounds some near-ties the other way


def test_a_qat_models_graphs_run_without_grappler_and_a_float_models_with_it(trained):
    import tensorflow as tf

    from edgevit.quantize.graph_rewrites import for_model

    model, qat, _ = trained

    def meta_optimizer_off():
        return tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)

    assert for_model(qat, meta_optimizer_off)() is True
    assert meta_optimizer_off() is False  # restored after the call
    assert for_model(model, meta_optimizer_off)() is False
