"""CrossViT: exact sizes, the exact bicubic branch resize, serialisation,
deployment rules."""
import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.layers import BicubicResize, bicubic_matrix
from edgevit.registry import get_spec
from tests.helpers import COSINE_FLOOR, assert_deployable, export_variant, round_trip_outputs, zero_initialisers

# timm crossvit_*_240 (1000 classes, 240x240).
OFFICIAL_PARAMS = {
    "crossvit_tiny": 7_014_800, "crossvit_small": 26_856_272, "crossvit_base": 105_025_232,
    "crossvit_9": 8_553_296, "crossvit_15": 27_528_464, "crossvit_18": 43_271_408,
}
SLOW_COUNT = {"crossvit_base", "crossvit_18", "crossvit_15"}
SMALL_SIZE = 120

# PyTorch F.interpolate(x, size=3, mode="bicubic", align_corners=False) of
# [0, 1, 4, 9, 16] (torch 2.13, float32), the reference the matrices reproduce.
TORCH_BICUBIC_5_TO_3 = [0.1481490135192871, 4.0, 14.074070930480957]


def test_registry_holds_the_crossvit_variants():
    assert edgevit.list_models("crossvit_*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_COUNT else n
                                  for n in sorted(OFFICIAL_PARAMS)])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 240


def test_bicubic_resize_is_two_constant_matrices_equal_to_pytorch():
    m = bicubic_matrix(5, 3, antialias=False)
    np.testing.assert_allclose(m @ np.array([0, 1, 4, 9, 16.0]), TORCH_BICUBIC_5_TO_3, rtol=1e-5)  # float32 reference
    np.testing.assert_allclose(bicubic_matrix(240, 224, antialias=False).sum(axis=1), 1.0, rtol=1e-6)
    x = np.random.default_rng(0).random((1, 10, 12, 2)).astype("float32")
    y = np.asarray(BicubicResize((6, 5))(x))
    mh, mw = bicubic_matrix(10, 6, antialias=False), bicubic_matrix(12, 5, antialias=False)
    expected = np.einsum("ih,bhwc,jw->bijc", mh, x, mw)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_smallest_variant_round_trips_and_converts(tmp_path):
    model = edgevit.create_model("crossvit_tiny", num_classes=10, input_size=SMALL_SIZE)
    assert model.get_layer("resize_1").output.shape[1:3] == (112, 112)
    x = np.random.default_rng(1).random((2, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    assert round_trip_outputs(tmp_path, model, x).shape == (2, 10)
    # int8 alone here, every precision in the slow matrix
    report = export_variant(tmp_path, "crossvit_tiny", "int8", SMALL_SIZE, model=model)
    assert_deployable(report)
    assert report["agreement"]["cosine_mean"] > COSINE_FLOOR["int8"], report["agreement"]
    # the branch resize is matrix products, no GATHER_ND / RESIZE_BICUBIC
    assert not {"GATHER_ND", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"} & set(report["op_histogram"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    report = export_variant(tmp_path, name, precision, 240)
    assert_deployable(report)
    assert report["agreement"]["cosine_mean"] > COSINE_FLOOR[precision], report["agreement"]
