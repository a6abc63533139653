"""`edgevit check` rules on crafted models: what the GPU / NNAPI delegates
would leave on the CPU, and how many delegate partitions remain."""
import keras
import numpy as np
import pytest

from edgevit.export.convert import convert
from edgevit.litert.delegates import check, partition
from edgevit.litert.flatbuffer import read
from edgevit.litert.gpu_rules import check_gpu
from edgevit.litert.nnapi_rules import check_nnapi, nnapi_feature_level


def plain_model():
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(10)(x)
    return keras.Model(inputs, keras.layers.Softmax()(x), name="plain")


def sandwich_model(middle):
    """conv -> MIDDLE -> conv -> dense: MIDDLE decides the partitions."""
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 1)(inputs)
    x = middle(x)
    x = keras.layers.Conv2D(4, 1)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(5)(x), name="sandwich")


def rank6_transpose(x):
    x = keras.layers.Reshape((4, 2, 4, 2, 4))(x)
    x = keras.layers.Permute((1, 3, 2, 4, 5))(x)
    return keras.layers.Reshape((8, 8, 4))(x)


def topk_model():
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Flatten()(keras.layers.Conv2D(4, 1)(inputs))
    x = keras.layers.Lambda(lambda t: keras.ops.top_k(t, k=16)[0], output_shape=(16,))(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x), name="topk")


def cumsum_gelu_model():
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 1)(inputs)
    x = keras.layers.Lambda(lambda t: keras.ops.cumsum(t, axis=-1), output_shape=(8, 8, 4))(x)
    x = keras.layers.Activation("gelu")(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x), name="cumsum_gelu")


CALIB = np.random.default_rng(0).normal(size=(4, 16, 16, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def files():
    plain = plain_model()
    return {
        "plain_fp32": convert(plain, "fp32"),
        "plain_fp16": convert(plain, "fp16"),
        "plain_int8": convert(plain, "int8", CALIB),
        "plain_int16x8": convert(plain, "int16x8", CALIB),
        "rank6": convert(sandwich_model(rank6_transpose), "fp32"),
        "topk": convert(topk_model(), "fp32"),
        "cumsum_gelu": convert(cumsum_gelu_model(), "fp32"),
    }


@pytest.mark.parametrize("name", ["plain_fp32", "plain_fp16", "plain_int8"])
def test_plain_conv_dense_softmax_passes_with_one_partition(files, name):
    reports = check(files[name])
    for delegate in ("gpu", "nnapi"):
        r = reports[delegate]
        assert r.fallbacks == [], (delegate, r.fallbacks)
        assert r.partitions == 1 and r.supported_ops == r.ops == r.partition_sizes[0]
        assert r.ops_on_delegate_by_default == r.ops


def test_fp16_weight_dequantize_ops_are_folded_not_counted(files):
    graph = read(files["plain_fp16"])
    dequant = [op for op in graph.ops if op.name == "DEQUANTIZE"]
    assert dequant and all(op.input(0).dtype == "float16" and op.input(0).is_const for op in dequant)
    assert check_gpu(graph).ops == len(graph.ops) - len(dequant) == check_gpu(files["plain_fp32"]).ops


def test_rank6_transpose_is_flagged_for_gpu_and_splits_the_graph(files):
    r = check_gpu(files["rank6"])
    flagged = {f.op: f.reason for f in r.fallbacks}
    assert set(flagged) == {"RESHAPE", "TRANSPOSE"}
    assert "6-D tensor" in flagged["TRANSPOSE"] and "rank <= 4" in flagged["TRANSPOSE"]
    assert len(r.fallbacks) == 3            # reshape in, transpose, reshape out
    assert r.partitions == 2 and r.partition_sizes == [1, 3]   # conv | conv, mean, dense
    assert r.ops_on_delegate_by_default == 3  # an app's GPU delegate takes the largest only
    nn = check_nnapi(files["rank6"])
    assert {f.op for f in nn.fallbacks} == {"RESHAPE", "TRANSPOSE"} and nn.partitions == 2


def test_topk_is_flagged_for_gpu_but_taken_by_nnapi(files):
    gpu = check_gpu(files["topk"])
    assert [(f.op, f.reason) for f in gpu.fallbacks] == [("TOPK_V2", "TOPK_V2 is not supported by the GPU delegate")]
    assert gpu.partitions == 2
    assert check_nnapi(files["topk"]).fallbacks == []


def test_cumsum_and_gelu_run_on_gpu_but_fall_back_under_nnapi(files):
    assert check_gpu(files["cumsum_gelu"]).fallbacks == []
    nn = check_nnapi(files["cumsum_gelu"])
    assert sorted(f.op for f in nn.fallbacks) == ["CUMSUM", "GELU"]
    assert all("not supported by the NNAPI delegate" in f.reason for f in nn.fallbacks)
    assert nn.partitions == 2


def test_int16x8_activations_are_refused_by_both_delegates(files):
    gpu = check_gpu(files["plain_int16x8"])
    assert gpu.fallbacks and all("int16" in f.reason for f in gpu.fallbacks if f.op == "CONV_2D")


def test_nnapi_rules_follow_the_android_level(files):
    # BATCH_MATMUL needs NNAPI feature level 6 (Android 13).
    inputs = keras.Input((4, 8))
    q = keras.layers.Dense(8)(inputs)
    att = keras.layers.Lambda(lambda t: keras.ops.matmul(t, keras.ops.transpose(t, (0, 2, 1))),
                              output_shape=(4, 4))(q)
    content = convert(keras.Model(inputs, keras.layers.Softmax()(att), name="att"), "fp32")
    assert "BATCH_MATMUL" not in {f.op for f in check_nnapi(content, android_api=33).fallbacks}
    old = check_nnapi(content, android_api=30)
    assert any(f.op == "BATCH_MATMUL" and "Android 13" in f.reason for f in old.fallbacks)
    assert nnapi_feature_level(29) == 29 and nnapi_feature_level(34) > nnapi_feature_level(33)


def test_partition_counts_independent_runs_greedily():
    class T:
        def __init__(self, index):
            self.index = index

    class FakeOp:
        def __init__(self, ins, outs):
            self.inputs, self.outputs = [T(i) for i in ins], [T(o) for o in outs]

    class G:
        pass

    # Two parallel branches from input 0: a(sup) b(unsup) c(sup, reads a), d(sup, reads b and c).
    g = G()
    g.ops = [FakeOp([0], [1]), FakeOp([0], [2]), FakeOp([1], [3]), FakeOp([2, 3], [4])]
    g.producers = {1: 0, 2: 1, 3: 2, 4: 3}
    # a and c join one subset even though b sits between them in execution order.
    assert partition(g, [True, False, True, True]) == [[0, 2], [3]]
    assert partition(g, [True, True, True, True]) == [[0, 1, 2, 3]]


def test_vit_class_token_slice_is_a_gpu_parameter_limit():
    # x[:, 0] on [1, tokens, channels] converts to STRIDED_SLICE with shrink_axis_mask.
    inputs = keras.Input((5, 8))
    x = keras.layers.Dense(8)(inputs)
    cls = keras.layers.Lambda(lambda t: t[:, 0], output_shape=(8,))(x)
    content = convert(keras.Model(inputs, keras.layers.Dense(3)(cls), name="cls"), "fp32")
    gpu = check_gpu(content)
    assert [(f.op, f.reason) for f in gpu.fallbacks] == [("STRIDED_SLICE", "shrink_axis_mask is not supported")]
    assert gpu.partitions == 2
    assert check_nnapi(content).fallbacks == []


def test_gpu_warns_about_batch_matmul_adjoint_flags_it_ignores():
    # The converter fuses q @ transpose(k) into BATCH_MATMUL(adj_y=True).
    inputs = keras.Input((4, 8))
    q = keras.layers.Dense(8)(inputs)
    att = keras.layers.Lambda(lambda t: keras.ops.matmul(t, keras.ops.transpose(t, (0, 2, 1))),
                              output_shape=(4, 4))(q)
    content = convert(keras.Model(inputs, keras.layers.Softmax()(att), name="att"), "fp32")
    gpu = check_gpu(content)
    assert gpu.fallbacks == [] and gpu.partitions == 1
    assert [(w.op, w.reason.split(":")[0]) for w in gpu.warnings] == [("BATCH_MATMUL", "adj_y=true")]
    assert check_nnapi(content).warnings == []
