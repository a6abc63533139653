"""PiT: exact sizes, pooling shapes, serialisation, deployment rules."""
import pytest


import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# timm pit_*_224 (1000 classes, 224x224).
OFFICIAL_PARAMS = {"pit_ti": 4_847_272, "pit_xs": 10_618_888, "pit_s": 23_461_912, "pit_b": 73_764_840}
SMALL_SIZE = 32


def test_registry_holds_the_pit_variants():
    assert edgevit.list_models("pit_*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", [*sorted(set(OFFICIAL_PARAMS) - {"pit_b"}),
                                  pytest.param("pit_b", marks=pytest.mark.slow)])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 224


def test_pooling_halves_the_grid_and_doubles_the_width():
    with zero_initialisers():
        model = edgevit.create_model("pit_ti")
    assert model.get_layer("patch_embed.conv").output.shape[1:] == (27, 27, 64)
    assert model.get_layer("transformers.1.pool.conv").output.shape[1:] == (14, 14, 128)
    assert model.get_layer("transformers.2.pool.conv").output.shape[1:] == (7, 7, 256)
    assert model.get_layer("transformers.2.pool.fc").output.shape[1:] == (1, 256)


def test_smallest_variant_round_trips_and_converts(tmp_path):
    _, reports = round_trips_and_converts(tmp_path, "pit_ti", SMALL_SIZE)
    report = reports["int8"]
    assert "DEPTHWISE_CONV_2D" in report["op_histogram"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, 224)
