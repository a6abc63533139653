"""T2T-ViT: exact sizes, the soft split, the token grids, serialisation,
deployment rules, and what int8_mixed keeps in float."""
import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.litert.flatbuffer import read
from edgevit.info import count_params
from edgevit.layers.soft_split import SoftSplit
from edgevit.layers.tokens import sinusoid_table
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# The official repository's models (yitu-opensource/T2T-ViT 0f63dc9, 1000
# classes, 224x224): (trainable parameters, every parameter as its
# train.py counts them, i.e. with the fixed sinusoid table and the
# Performers' random feature directions; the README's 4.3M ... 64.1M).
OFFICIAL_PARAMS = {
    "t2t_vit_7": (4_255_694, 4_310_222), "t2t_vit_10": (5_834_702, 5_889_230),
    "t2t_vit_12": (6_887_374, 6_941_902), "t2t_vit_14": (21_465_806, 21_545_550),
    "t2t_vit_19": (39_085_070, 39_177_422), "t2t_vit_24": (64_000_974, 64_105_934),
    "t2t_vit_t_14": (21_465_422, 21_541_070), "t2t_vit_t_19": (39_084_686, 39_172_942),
    "t2t_vit_t_24": (64_000_590, 64_101_454),
}
DEFAULT = ["t2t_vit_7", "t2t_vit_t_14"]
SMALL_SIZE = 32


def test_registry_holds_the_t2t_variants():
    assert edgevit.list_models("t2t_vit*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", [*DEFAULT, *(pytest.param(n, marks=pytest.mark.slow)
                                              for n in sorted(set(OFFICIAL_PARAMS) - set(DEFAULT)))])
def test_parameter_count_equals_the_official_code(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    trainable, total = OFFICIAL_PARAMS[name]
    assert count_params(model) == trainable
    assert sum(w.numpy().size for w in model.weights) == total
    assert model.name == name and get_spec(name).default_input_size == 224


def unfold(x, kernel, stride, padding):
    """``nn.Unfold`` of an NHWC batch, as ``[B, H', W', C * k * k]`` with
    PyTorch's (channel, row, column) order."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    rows = (x.shape[1] - kernel) // stride + 1
    cols = (x.shape[2] - kernel) // stride + 1
    out = np.empty((x.shape[0], rows, cols, x.shape[3], kernel, kernel), x.dtype)
    for i in range(rows):
        for j in range(cols):
            patch = x[:, i * stride:i * stride + kernel, j * stride:j * stride + kernel]
            out[:, i, j] = np.transpose(patch, (0, 3, 1, 2))
    return out.reshape(x.shape[0], rows, cols, -1)


@pytest.mark.parametrize("kernel,stride,padding,size", [(7, 4, 2, 32), (3, 2, 1, 8), (3, 2, 1, 7)])
def test_soft_split_is_unfold_with_its_channel_order(kernel, stride, padding, size):
    x = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype(np.float32)
    got = np.asarray(SoftSplit(kernel, stride, padding)(x))
    np.testing.assert_array_equal(got, unfold(x, kernel, stride, padding))


def test_token_grids_follow_the_three_soft_splits():
    with zero_initialisers():
        model = edgevit.create_model("t2t_vit_7")
    assert model.get_layer("tokens_to_token.soft_split0").output.shape[1:] == (56, 56, 147)
    assert model.get_layer("tokens_to_token.attention1.add").output.shape[1:] == (3136, 64)
    assert model.get_layer("tokens_to_token.soft_split1").output.shape[1:] == (28, 28, 576)
    assert model.get_layer("tokens_to_token.project").output.shape[1:] == (14, 14, 256)
    assert model.get_layer("pos_embed").pos_embed.shape == (1, 197, 256)
    assert not model.get_layer("pos_embed").trainable_weights  # the fixed sinusoid table


def test_position_table_is_the_official_sinusoid_table():
    """Entries of the official ``get_sinusoid_encoding(197, 256)`` (yitu-opensource/T2T-ViT
    0f63dc9; the whole table was equal to ``sinusoid_table`` to the last bit)."""
    table = sinusoid_table(197, 256)
    official = {(1, 0): 0.8414709568023682, (1, 1): 0.5403022766113281, (5, 10): -0.3406049609184265,
                (100, 255): 0.9999422430992126, (196, 128): 0.9252115488052368, (196, 129): -0.3794517517089844}
    assert {k: float(table[k]) for k in official} == official
    assert not table[0, 0::2].any() and (table[0, 1::2] == 1).all()


def test_smallest_variant_round_trips_and_converts(tmp_path):
    """Full int8 at 32 px: deployment rules, the all-integer audit,
    the GPU accelerator run; then --int8-mixed keeps the Performers' ops
    and the first LayerNorm (over raw pixel patches) in float."""
    model, reports = round_trips_and_converts(tmp_path, "t2t_vit_7", SMALL_SIZE)
    assert reports["int8"]["op_histogram"]["EXP"] == 4 and "DIV" not in reports["int8"]["op_histogram"]
    mixed = exports_within_floor(tmp_path, "t2t_vit_7", "int8_mixed", SMALL_SIZE, model=model)
    graph = read((tmp_path / "t2t_vit_7_int8_mixed.tflite").read_bytes())
    float_ops = [(op.name, op.outputs[0].name.split(";")[0]) for op in graph.ops
                 if op.outputs[0].dtype == "float32" and op.name not in ("QUANTIZE", "DEQUANTIZE")]
    performers = [kind for kind, name in float_ops if "/tokens_to_token.attention" in name]
    assert performers.count("EXP") == 4 and performers.count("BATCH_MATMUL") == 4, float_ops
    # the blocks as int8_mixed keeps every family: attention matmuls, softmax, LayerNorm's rsqrt in float
    assert {kind for kind, name in float_ops if "/blocks." in name} == {"BATCH_MATMUL", "SOFTMAX", "RSQRT", "ADD"}
    assert mixed["agreement"]["cosine_mean"] > 0.99

@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, 224)
