"""PVT v2: exact sizes, the pyramid and its spatial-reduction attention,
input sizes, serialisation, deployment rules (GPU and NNAPI tables)."""
import pytest

import edgevit
from edgevit.errors import EdgevitError
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# timm pvt_v2_* (1000 classes; timm builds them for any input size).
OFFICIAL_PARAMS = {"pvt_v2_b0": 3_666_760, "pvt_v2_b1": 14_009_000, "pvt_v2_b2": 25_362_856,
                   "pvt_v2_b2_li": 22_553_512, "pvt_v2_b3": 45_238_696, "pvt_v2_b4": 62_556_072,
                   "pvt_v2_b5": 81_956_008}
DEFAULT_COUNTED = ("pvt_v2_b0", "pvt_v2_b1", "pvt_v2_b2")  # b2_li: in its own test
# 64 px: every stage's reduced keys/values are a 2x2 map (at 32 px a single token)
SMALL_SIZE = 64


def test_registry_holds_the_pvt_v2_variants():
    assert edgevit.list_models("pvt_v2_*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", [*DEFAULT_COUNTED, *[pytest.param(n, marks=pytest.mark.slow)
                                                      for n in sorted(set(OFFICIAL_PARAMS) - set(DEFAULT_COUNTED))]])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 224
    assert not any("pos_embed" in w.path for w in model.weights)


def test_pyramid_and_spatial_reduction():
    with zero_initialisers():
        model = edgevit.create_model("pvt_v2_b0")
    shape = {name: tuple(model.get_layer(name).output.shape[1:]) for name in (
        "patch_embed.proj", "stages.1.downsample.proj", "stages.2.downsample.proj", "stages.3.downsample.proj",
        "stages.0.blocks.0.attn.sr", "stages.1.blocks.0.attn.sr", "stages.2.blocks.0.attn.sr",
        "stages.0.blocks.0.mlp.dwconv")}
    assert shape == {"patch_embed.proj": (56, 56, 32), "stages.1.downsample.proj": (28, 28, 64),
                     "stages.2.downsample.proj": (14, 14, 160), "stages.3.downsample.proj": (7, 7, 256),
                     # keys and values from a 7x7 map in every stage with a reduction
                     "stages.0.blocks.0.attn.sr": (7, 7, 32), "stages.1.blocks.0.attn.sr": (7, 7, 64),
                     "stages.2.blocks.0.attn.sr": (7, 7, 160), "stages.0.blocks.0.mlp.dwconv": (56, 56, 256)}
    # the last stage attends over all 49 tokens (sr 1: no reduction layers)
    names = {layer.name for layer in model.layers}
    assert "stages.3.blocks.0.attn.sr" not in names
    assert model.get_layer("stages.3.blocks.0.attn.split_kv").output[0].shape[1:] == (49, 256)


def test_linear_variant_pools_keys_and_values_to_7x7():
    with zero_initialisers():
        model = edgevit.create_model("pvt_v2_b2_li")
    assert count_params(model) == OFFICIAL_PARAMS["pvt_v2_b2_li"]
    for stage, pool in enumerate((8, 4, 2, 1)):
        layer = model.get_layer(f"stages.{stage}.blocks.0.attn.pool")
        assert layer.pool_size == (pool, pool) and layer.output.shape[1:3] == (7, 7)
    assert "stages.0.blocks.0.mlp.relu" in {layer.name for layer in model.layers}


def test_input_sizes():
    assert get_spec("pvt_v2_b0").input_size_multiple == 32
    model = edgevit.create_model("pvt_v2_b0", num_classes=3, input_size=96)
    assert model.get_layer("stages.3.downsample.proj").output.shape[1:3] == (3, 3)
    with pytest.raises(EdgevitError, match="multiple of 32"):
        edgevit.create_model("pvt_v2_b0", input_size=100)
    # adaptive pooling to 7x7 is an average pool when each stage's map is a multiple of 7
    with pytest.raises(EdgevitError, match="multiple of 224"):
        edgevit.create_model("pvt_v2_b2_li", input_size=256)


def test_smallest_variant_round_trips_and_converts(tmp_path):
    _, reports = round_trips_and_converts(tmp_path, "pvt_v2_b0", SMALL_SIZE)
    report = reports["int8"]
    assert {"DEPTHWISE_CONV_2D", "BATCH_MATMUL", "GELU"} <= set(report["op_histogram"])
    assert "RSQRT" not in report["op_histogram"]
    delegates = report["delegates"]
    assert delegates["gpu"]["fallbacks"] == []
    # NNAPI (Android 13 rules) takes everything but the GELUs, which no NNAPI version has
    assert {f["op"] for f in delegates["nnapi"]["fallbacks"]} == {"GELU"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, 224)
