"""DeepViT-S: exact size, Re-Attention math, serialisation, deployment rules."""
import numpy as np
import pytest


import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.models.deepvit import ReAttention
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# DeepViT paper, Table 6: DeepViT-S 27M; exact count of the released
# deepvit_S definition (CNN patch embedding, 16 blocks of width 396, the last
# 5 with Re-Attention), 1000 classes.
OFFICIAL_PARAMS = {"deepvit_s": 27_312_632}
SMALL_SIZE = 32


def test_registry_and_parameter_count():
    assert edgevit.list_models("deepvit*") == ["deepvit_s"]
    with zero_initialisers():
        model = edgevit.create_model("deepvit_s")
    assert count_params(model) == OFFICIAL_PARAMS["deepvit_s"]
    assert round(count_params(model) / 1e6) == 27
    assert [i for i in range(16) if model.get_layer(f"blocks.{i}.attn").apply_transform] == [11, 12, 13, 14, 15]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_re_attention_mixes_heads_then_normalises():
    """Numpy reference: Norm(Theta^T softmax(q k^T * s)) * s @ v, BatchNorm
    with its moving statistics, heads mixed by the 1x1 matrix."""
    rng = np.random.default_rng(0)
    layer = ReAttention(24, 4)
    x = rng.normal(size=(1, 5, 24)).astype("float32")
    layer(x)
    layer.var_norm.set_weights([rng.uniform(0.5, 2, 4), rng.normal(size=4), rng.normal(size=4),
                                rng.uniform(0.5, 2, 4)])
    (wqkv, bqkv), (wp, bp) = layer.qkv.get_weights(), layer.proj.get_weights()
    theta, theta_b = layer.reatten_matrix.get_weights()
    gamma, beta, mean, var = layer.var_norm.get_weights()
    qkv = (x @ wqkv + bqkv).reshape(1, 5, 3, 4, 6).transpose(2, 0, 3, 1, 4)
    s = 6 ** -0.5
    attn = _softmax(qkv[0] @ qkv[1].transpose(0, 1, 3, 2) * s)                      # [1, H, N, N]
    mixed = np.einsum("bhij,hg->bgij", attn, theta) + theta_b[None, :, None, None]
    mixed = (mixed - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * gamma[:, None, None] \
        + beta[:, None, None]
    out = (mixed * s @ qkv[2]).transpose(0, 2, 1, 3).reshape(1, 5, 24) @ wp + bp
    np.testing.assert_allclose(np.asarray(layer(x)), out, rtol=1e-4, atol=1e-5)


def test_smallest_variant_round_trips_and_converts(tmp_path):
    round_trips_and_converts(tmp_path, "deepvit_s", SMALL_SIZE)


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, precision):
    exports_within_floor(tmp_path, "deepvit_s", precision, 224)
