"""CvT: exact sizes, conv projections, serialisation, deployment rules."""
import pytest


import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, round_trips_and_converts, zero_initialisers

# Hugging Face transformers CvtForImageClassification(CvtConfig(depth=...,
# num_labels=1000)) trainable parameters: CvT-13 depth (1, 2, 10), CvT-21 (1, 4, 16).
OFFICIAL_PARAMS = {"cvt_13": 19_997_480, "cvt_21": 31_622_696}
SMALL_SIZE = 32


def test_registry_holds_the_cvt_variants():
    assert edgevit.list_models("cvt_*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
def test_parameter_count_equals_hugging_face(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 224
    # keys/values come from a stride-2 depthwise conv + BatchNorm of the map
    assert model.get_layer("stage2.blocks.0.attn.conv_proj_k.conv").output.shape[1:3] == (7, 7)
    assert model.get_layer("stage2.blocks.0.attn.conv_proj_q.conv").output.shape[1:3] == (14, 14)
    assert not any("pos_embed" in w.path for w in model.weights)


def test_smallest_variant_round_trips_and_converts(tmp_path):
    _, reports = round_trips_and_converts(tmp_path, "cvt_13", SMALL_SIZE)
    report = reports["int8"]
    assert "DEPTHWISE_CONV_2D" in report["op_histogram"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, 224)
