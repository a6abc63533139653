"""CSWin Transformer: exact sizes, stripe windows, input sizes,
serialisation, deployment rules and integer-exact QAT.

cswin_tiny has 25 blocks (21 in stage 3), all alike within a stage. The
default conversion test uses it with one block per stage: every kind of
block, stripe and LePE of the full model, in a fifth of the graph; the full
variants convert behind ``-m slow``."""
import dataclasses

import keras
import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.layers.windows import WindowPartition
from edgevit.models.cswin import CONFIGS, build_cswin, cross_shaped_attention, stripes
from edgevit.registry import get_spec
from tests.helpers import exports_within_floor, int8_and_qat_outputs, round_trip_outputs, zero_initialisers

# Official models/cswin.py (microsoft/CSWin-Transformer f111ae2), 1000 classes.
OFFICIAL_PARAMS = {"cswin_tiny": 22_320_552, "cswin_small": 34_643_304, "cswin_base": 77_382_184,
                   "cswin_large": 173_262_664, "cswin_base_384": 77_382_184, "cswin_large_384": 173_262_664}
SMALL_SIZE = 64


def shallow_tiny(input_size: int, num_classes: int = 10):
    """cswin_tiny with one block per stage, under the variant's name (the
    export and ``edgevit.saving`` look its preprocessing up by name)."""
    cfg = dataclasses.replace(CONFIGS["cswin_tiny"], depths=(1, 1, 1, 1))
    return build_cswin(cfg, "cswin_tiny", num_classes, input_size)


def test_registry_holds_the_cswin_variants():
    assert edgevit.list_models("cswin*") == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", ["cswin_tiny", *[pytest.param(n, marks=pytest.mark.slow)
                                                  for n in sorted(set(OFFICIAL_PARAMS) - {"cswin_tiny"})]])
def test_parameter_count_equals_the_official_code(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert get_spec(name).default_input_size == (384 if name.endswith("_384") else 224)


def test_half_the_heads_attend_in_vertical_stripes_half_in_horizontal_ones():
    """At 224: stripes 1, 2 and 7 wide on the 56, 28 and 14 maps, each
    branch on half of the channels; the 7x7 last stage attends over it all."""
    with zero_initialisers():
        model = edgevit.create_model("cswin_tiny")
    windows = {name: model.get_layer(name).output.shape[1:] for name in
               ["stage1.0.attns.0.partition", "stage1.0.attns.1.partition", "stage2.1.attns.0.partition",
                "stage2.1.attns.1.partition", "stage3.20.attns.0.partition", "stage3.20.attns.1.partition"]}
    assert list(windows.values()) == [(56, 1, 32), (1, 56, 32), (28, 2, 64), (2, 28, 64), (14, 7, 128),
                                      (7, 14, 128)]
    assert model.get_layer("stage3.0.attns.1.attn").num_heads == 4
    assert model.get_layer("stage4.0.attns.0.attn").num_heads == 16
    assert model.get_layer("stage4.0.attns.0.get_v").output.shape[1:] == (7, 7, 512)
    assert not any(layer.name.startswith("stage4") and isinstance(layer, WindowPartition) for layer in model.layers)


def test_stripes_wider_than_the_map_cover_it_and_others_must_divide_it():
    assert stripes((4, 4), 7) == [(4, 4), (4, 4)]
    assert stripes((28, 28), 2) == [(28, 2), (2, 28)]
    with pytest.raises(edgevit.EdgevitError, match=r"Input size 128 does not work for cswin_tiny: stage 3's 8x8 "
                                                   r"map does not split into stripes 7 wide; e.g. 96 or 224\."):
        edgevit.create_model("cswin_tiny", input_size=128)
    with pytest.raises(edgevit.EdgevitError, match=r"stage 3's 14x14 map .* stripes 12 wide; e.g. 192 or 384\."):
        edgevit.create_model("cswin_base_384", input_size=224)
    with pytest.raises(edgevit.EdgevitError, match="multiple of 32"):
        edgevit.create_model("cswin_tiny", input_size=112)


def test_one_block_per_stage_round_trips_and_converts(tmp_path):
    model = shallow_tiny(SMALL_SIZE)
    x = np.random.default_rng(1).random((2, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    assert round_trip_outputs(tmp_path, model, x).shape == (2, 10)
    for precision in ("fp32", "int8"):
        report = exports_within_floor(tmp_path, "cswin_tiny", precision, SMALL_SIZE, model=model)
        assert {"DEPTHWISE_CONV_2D", "TRANSPOSE", "SPLIT"} <= set(report["op_histogram"])


@pytest.mark.parametrize("windows", [[(8, 2), (2, 8)], [(8, 8)]], ids=["stripes", "whole map"])
def test_cross_shaped_attention_converts_to_an_int8_file_that_computes_exactly_what_its_qat_model_computes(
        tmp_path, windows):
    """The qkv splits, stripe partition and merge, LePE on the windows and
    the join of the two branches add no rounding the QAT model does not
    make: every output equals the int8 file's on LiteRT's XNNPACK kernels.
    (A LayerNorm before it rounds a few ties the other way, as in every
    family: DEVELOPERS.md, known limits.)"""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8, 8, 16), name="map")
    model = keras.Model(inputs, cross_shaped_attention(inputs, 4, windows, name="attn"), name="cross_shaped")
    x = np.random.default_rng(2).normal(0, 1, (32, 8, 8, 16)).astype(np.float32)
    np.testing.assert_array_equal(*int8_and_qat_outputs(tmp_path, model, x, input_range=(-4.0, 4.2)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, get_spec(name).default_input_size)
