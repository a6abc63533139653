"""ConViT: exact sizes, GPSA locality init, serialisation, deployment rules."""
import numpy as np
import pytest


import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.models.convit import relative_indices
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# timm convit_* (1000 classes, 224x224).
OFFICIAL_PARAMS = {"convit_tiny": 5_710_512, "convit_small": 27_777_322, "convit_base": 86_540_040}
SMALL_SIZE = 32


def test_registry_holds_the_convit_variants():
    assert edgevit.list_models("convit_*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", ["convit_tiny", "convit_small",
                                  pytest.param("convit_base", marks=pytest.mark.slow)])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 224


def test_gpsa_starts_local_and_the_class_token_joins_late():
    """Locality init: v is the identity and the positional attention of every
    head peaks at a different neighbour offset (a 3x3 layout for 9 heads)."""
    model = edgevit.create_model("convit_small", num_classes=10, input_size=112)
    attn = model.get_layer("blocks.0.attn")
    np.testing.assert_array_equal(attn.v.kernel.numpy(), np.eye(432, dtype="float32"))
    rel = relative_indices(7)
    centre = 3 * 7 + 3
    scores = rel[centre] @ attn.pos_proj.kernel.numpy() + attn.pos_proj.bias.numpy()  # [N, heads]
    peaks = {tuple(rel[centre, j, :2].astype(int)) for j in scores.argmax(axis=0)}
    assert peaks == {(dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    # GPSA blocks see the 49 patches only; the class token joins at block 10
    assert model.get_layer("blocks.9.attn").output.shape[1] == 49
    assert model.get_layer("blocks.10.join1").output.shape[1] == 50


def test_smallest_variant_round_trips_and_converts(tmp_path):
    round_trips_and_converts(tmp_path, "convit_tiny", SMALL_SIZE)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, 224)
