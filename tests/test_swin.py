"""Swin v1 and v2: exact sizes, windows and shifts per stage, the shift
mask, deployment rules (no ROLL/GATHER, rank <= 4, the bias and mask as
constants, masked scores on a narrow int8 grid), official-release
checkpoints."""
import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.layers import DropPath
from edgevit.litert.flatbuffer import read
from edgevit.models.swin import CONFIGS, shift_mask, stage_window
from edgevit.registry import get_spec
from tests.helpers import export_variant, exports_within_floor, round_trips_and_converts, zero_initialisers

# timm swin_*_patch4_window*_* / swinv2_*_window*_* at their default input
# size; the 192 px v2 models are ImageNet-22k pre-training checkpoints.
OFFICIAL_PARAMS = {
    "swin_tiny": 28_288_354, "swin_small": 49_606_258, "swin_base": 87_768_224, "swin_large": 196_532_476,
    "swin_base_384": 87_903_584, "swin_large_384": 196_735_516,
    "swinv2_tiny": 28_347_154, "swinv2_small": 49_728_418, "swinv2_base": 87_918_816,
    "swinv2_tiny_w16": 28_347_154, "swinv2_small_w16": 49_728_418, "swinv2_base_w16": 87_918_816,
    "swinv2_base_w12_192": 109_280_841, "swinv2_large_w12_192": 228_772_549,
    "swinv2_base_w12to16": 87_918_816, "swinv2_large_w12to16": 196_739_932,
    "swinv2_base_w12to24": 87_918_816, "swinv2_large_w12to24": 196_739_932,
}
CLASSES = {"swinv2_base_w12_192": 21841, "swinv2_large_w12_192": 21841}
SMALLEST = ("swin_tiny", "swinv2_tiny")
# At 64 px swin_tiny's first two stages are zero-padded to whole 7x7 windows
# and shifted, swinv2_tiny's first stage is shifted 8x8 windows; later
# stages are one window each.
SMALL_SIZE = 64


def test_registry_holds_the_swin_variants():
    assert edgevit.list_models("swin*") == sorted(OFFICIAL_PARAMS)
    assert {get_spec(n).family for n in OFFICIAL_PARAMS} == {"swin", "swinv2"}


@pytest.mark.parametrize("name", [*SMALLEST, *[pytest.param(n, marks=pytest.mark.slow)
                                               for n in sorted(set(OFFICIAL_PARAMS) - set(SMALLEST))]])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name, num_classes=CLASSES.get(name, 1000))
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name


def test_windows_shifts_and_merges_follow_the_map():
    """Each stage's window is clamped to its map, where nothing shifts;
    maps that do not divide into windows are padded (timm's rules)."""
    with zero_initialisers():
        model = edgevit.create_model("swin_tiny", input_size=SMALL_SIZE)
    attention = {(s, b): model.get_layer(f"layers.{s}.blocks.{b}.attn") for s in range(4) for b in range(2)}
    assert [(a.grid, a.window, a.padded, a.shift) for (s, b), a in attention.items() if b == 1] == \
        [(16, 7, 21, 3), (8, 7, 14, 3), (4, 4, 4, 0), (2, 2, 2, 0)]
    assert attention[(0, 0)].shift == 0 and attention[(0, 1)].windows == 9
    assert model.get_layer("layers.1.downsample.reduction").output.shape[1:] == (64, 192)
    assert model.get_layer("layers.3.downsample.merge").output.shape[1:] == (2, 2, 1536)
    assert [stage_window(g, 8) for g in (64, 32, 16, 8)] == [(8, 4), (8, 4), (8, 4), (8, 0)]


def test_shift_mask_separates_the_regions_of_the_rolled_map():
    mask = shift_mask(14, 7, 3)[0, :, 0].reshape(4, 49, 49)
    regions = lambda rows, cols: [r * 7 + c for r in rows for c in cols]  # noqa: E731
    assert not mask[0].any()                                              # top-left: one region
    top, bottom = regions(range(4), range(7)), regions(range(4, 7), range(7))
    assert not mask[2][np.ix_(top, top)].any() and (mask[2][np.ix_(top, bottom)] == -100).all()
    assert len(np.unique(mask[3], axis=0)) == 4                          # bottom-right: four regions
    np.testing.assert_array_equal(mask[3], mask[3].T)


def test_smallest_v1_round_trips_and_converts(tmp_path):
    """At 32 px the first stage is padded from 8x8 to 14x14 and shifted. In
    int8-mixed the position bias and the mask stay in float with the
    attention matmuls and the softmax."""
    _, reports = round_trips_and_converts(tmp_path, "swin_tiny", 32, precisions=("int8_mixed",))
    assert {"STRIDED_SLICE", "CONCATENATION", "PAD"} <= set(reports["int8_mixed"]["op_histogram"])
    graph = read((tmp_path / "swin_tiny_int8_mixed.tflite").read_bytes())
    float_adds = [op for op in graph.ops if op.name == "ADD" and op.outputs[0].dtype == "float32"
                  and graph.ops[graph.consumers[op.outputs[0].index][0]].name in ("RESHAPE", "MUL", "ADD")]
    assert len(float_adds) == 12 + 1  # the bias of each block, the mask of the one shifted block


def test_smallest_v2_converts_to_int8_and_takes_drop_path(tmp_path):
    model = edgevit.create_model("swinv2_tiny", num_classes=10, input_size=SMALL_SIZE, drop_path_rate=0.2)
    rates = [layer.rate for layer in model.layers if isinstance(layer, DropPath)]
    assert len(rates) == 2 * (sum(CONFIGS["swinv2_tiny"].depths) - 1) and max(rates) == pytest.approx(0.2)
    report = exports_within_floor(tmp_path, "swinv2_tiny", "int8", SMALL_SIZE, model=model)
    assert not {"RSQRT", "LOGISTIC", "EXP"} & set(report["op_histogram"])  # normalisations, bias MLP, logit scale
    assert_masked_scores_saturate(tmp_path / "swinv2_tiny_int8.tflite", shifted_blocks=1)


def assert_masked_scores_saturate(path, shifted_blocks: int):
    """Each shifted block's softmax reads scores on a grid that reaches
    ~ln(512 N) below the unmasked scores, not down to the mask's -100, and
    the MUL by the 0/1 mask keeps the grid of the scores it multiplies."""
    graph = read(path.read_bytes())

    def producer(tensor):
        return graph.ops[graph.producers[tensor.index]]

    masked = 0
    for op in graph.ops:
        if op.name != "SOFTMAX":
            continue
        add = producer(producer(op.inputs[0]).inputs[0])   # SOFTMAX <- RESHAPE <- ADD
        kept = producer(add.runtime_inputs[0])
        if add.name != "ADD" or kept.name != "MUL":
            continue                                        # a block without shift: the bias ADD of the scores
        scores, out = kept.runtime_inputs[0], add.outputs[0]
        assert (kept.outputs[0].scale, kept.outputs[0].zero_point) == (scores.scale, scores.zero_point)
        bottom = out.scale * (-128 - out.zero_point)
        assert -30 < bottom < scores.scale * (-128 - scores.zero_point) - 9, bottom
        masked += 1
    assert masked == shifted_blocks


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALLEST)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    exports_within_floor(tmp_path, name, precision, get_spec(name).default_input_size)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(OFFICIAL_PARAMS) - set(SMALLEST)))
def test_every_variant_converts_to_int8_at_its_default_size(tmp_path, name):
    report = export_variant(tmp_path, name, "int8", get_spec(name).default_input_size)
    assert report["max_rank"] <= 4 and not [c for c in report["checks"] if not c["passed"]]


def test_official_release_names_are_timms_before_its_checkpoint_filter(tmp_path):
    """Official releases merge patches at the end of a stage and name the
    classifier ``head``; timm's checkpoint_filter_fn renames them. Every
    weight of both versions has a tensor of the same shape in that layout,
    timm's filter reads the layout back, and a checkpoint in it (a
    training checkpoint's ``model`` entry) is detected as official."""
    pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")
    import re

    import torch

    from edgevit.converters import import_weights
    from edgevit.converters.api import importers_for
    from edgevit.converters.parity import import_timm
    from edgevit.converters.rules import export_state_dict, plan
    from edgevit.converters.timm import TIMM_NAMES

    timm = import_timm()
    from timm.models import swin_transformer, swin_transformer_v2

    for name, module in (("swin_tiny", swin_transformer), ("swinv2_tiny", swin_transformer_v2)):
        with torch.device("meta"):
            reference = timm.create_model(TIMM_NAMES[name], img_size=32, num_classes=10)
        official = {re.sub(r"layers\.(\d)\.downsample", lambda m: f"layers.{int(m.group(1)) - 1}.downsample",
                           key).replace("head.fc.", "head."): value for key, value in reference.state_dict().items()}
        assert module.checkpoint_filter_fn(official, reference).keys() == reference.state_dict().keys()
        with zero_initialisers():
            model = edgevit.create_model(name, num_classes=10, input_size=32)
        written = export_state_dict(plan(model, importers_for(get_spec(name).family)["official"].rules(model),
                                         "official"))
        assert {k: v.shape for k, v in written.items()} == {k: tuple(v.shape) for k, v in official.items()}
    torch.save({"model": {k: torch.from_numpy(v) for k, v in written.items()}}, tmp_path / "swinv2.pth")
    result = import_weights(tmp_path / "swinv2.pth", "swinv2_tiny", input_size=32)
    assert (result.report["source"], result.report["entry"], result.report["num_classes"]) == ("official", "model", 10)
