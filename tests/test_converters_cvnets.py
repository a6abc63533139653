"""Apple ml-cvnets MobileViT v1/v2 and official MobileViTv3 checkpoints.

Each test writes a checkpoint in cvnets naming from edgevit's own (random)
weights, named ``checkpoint_ema_best.pt`` like the MobileViTv3 release, and
imports it back. The checkpoint's tensor names and shapes are pinned to the
official code: ``OFFICIAL`` holds, per variant, the number of tensors and a
hash of the sorted ``name:shape`` list of the official model's state dict
(BatchNorm counters excluded), computed by building the official models:

- v1:  apple/ml-cvnets d38a116fe134a8cd5db18670764fdaafd39a5d4f
- v2:  apple/ml-cvnets 84d992f413e52c0468f86d23196efd9dad885e6f
- v3:  those trees with micronDLA/MobileViTv3 d381beb (MobileViTv3-v1/, -v2/)

Against those official models, with random weights, the imported edgevit
models agree to <= 3e-5 max abs logit difference (converters/README.md).
"""
import functools
import hashlib

import pytest

import edgevit
from edgevit.converters import import_weights
from edgevit.converters.api import importers_for
from edgevit.converters.checkpoints import write_safetensors
from edgevit.converters.rules import export_state_dict, plan
from edgevit.registry import get_spec
from tests.helpers import assert_same_weights

OFFICIAL = {
    "mobilevit_v1_xxs": (279, "d914f1dbda7635b8"), "mobilevit_v1_xs": (279, "93dbbabe18e14d79"),
    "mobilevit_v1_s": (279, "911da601660064f8"),
    "mobilevit_v2_050": (244, "ea2c63e14703a3f6"), "mobilevit_v2_075": (244, "ca3e81b6a1de9879"),
    "mobilevit_v2_100": (244, "0214c37e71d9a78e"), "mobilevit_v2_125": (244, "71a765685443ff9e"),
    "mobilevit_v2_150": (244, "0008a3b657120d83"), "mobilevit_v2_175": (244, "d9c41653f5f0199d"),
    "mobilevit_v2_200": (244, "de9e802df5238c51"),
    "mobilevit_v3_xxs": (279, "2ee32ae667b904f4"), "mobilevit_v3_xs": (279, "d1ff50990f72144b"),
    "mobilevit_v3_s": (279, "2614367b87314616"), "mobilevit_v3_xxs_l2": (255, "ccc3ec2716da344c"),
    "mobilevit_v3_xs_l2": (255, "8f0e1049374e90f9"), "mobilevit_v3_s_l2": (255, "b022565fbdc132b1"),
    "mobilevit_v3_050": (244, "a3d94bdb6b5809f1"), "mobilevit_v3_075": (244, "45ef012fa71b16ba"),
    "mobilevit_v3_100": (244, "1019f5f3502f471c"),
}
# v3 on v1 and on v2 by default: they use the v1 and v2 rule tables
DEFAULT = ["mobilevit_v3_xxs", "mobilevit_v3_050"]
SIZE = 64  # tensor shapes do not depend on the input size


def cvnets_state_dict(model):
    importer = importers_for(get_spec(model.name).family)["cvnets"]
    return export_state_dict(plan(model, importer.rules(model), "cvnets"))


@functools.cache
def source_model(name):
    """A random-init model and its weights in cvnets naming (built once)."""
    model = edgevit.create_model(name, input_size=SIZE)
    return model, cvnets_state_dict(model)


def names_and_shapes_hash(state_dict):
    lines = sorted(f"{k}:{tuple(v.shape)}" for k, v in state_dict.items())
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def write_checkpoint(state_dict, folder):
    """As the release does (torch.save of the EMA state dict), or as
    .safetensors when torch is absent."""
    try:
        import torch
    except ImportError:
        path = folder / "checkpoint_ema_best.safetensors"
        write_safetensors(state_dict, path)
        return path
    path = folder / "checkpoint_ema_best.pt"
    torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, path)
    return path


def round_trip(tmp_path, name):
    source, state_dict = source_model(name)
    assert names_and_shapes_hash(state_dict) == OFFICIAL[name]
    path = write_checkpoint(state_dict, tmp_path)
    result = import_weights(path, name, input_size=SIZE)
    assert result.report["source"] == "cvnets" and result.report["tensors"] == OFFICIAL[name][0]
    assert_same_weights(source, result.model)


@pytest.mark.parametrize("name", DEFAULT)
def test_cvnets_round_trip_with_official_names(tmp_path, name):
    round_trip(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(OFFICIAL) - set(DEFAULT)))
def test_cvnets_round_trip_every_variant(tmp_path, name):
    round_trip(tmp_path, name)


def test_every_mobilevit_variant_has_an_official_name_table():
    assert sorted(OFFICIAL) == edgevit.list_models("mobilevit*")


@pytest.mark.parametrize("name,keys", [
    ("mobilevit_v3_xxs", {"conv_1.block.conv.weight": (16, 3, 3, 3),
                          "layer_3.1.local_rep.conv_3x3.block.conv.weight": (64, 1, 3, 3),
                          "layer_3.1.global_rep.0.pre_norm_mha.1.qkv_proj.weight": (192, 64),
                          "layer_3.1.fusion.block.conv.weight": (64, 128, 1, 1),
                          "classifier.fc.weight": (1000, 512)}),
    ("mobilevit_v3_050", {"layer_3.1.local_rep.1.block.conv.weight": (64, 128, 1, 1),
                          "layer_3.1.global_rep.0.pre_norm_attn.1.qkv_proj.block.conv.weight": (129, 64, 1, 1),
                          "layer_3.1.conv_proj.block.conv.weight": (128, 128, 1, 1),
                          "classifier.1.weight": (1000, 256)}),
])
def test_cvnets_names_read_like_the_official_code(name, keys):
    state_dict = source_model(name)[1]
    assert {k: tuple(state_dict[k].shape) for k in keys} == keys


def test_wrong_variant_names_first_mismatching_tensor(tmp_path):
    """An xxs checkpoint for the v1 xs: the first tensor of another shape,
    both shapes, in the checkpoint's layout."""
    path = write_checkpoint(source_model("mobilevit_v1_xxs")[1], tmp_path)
    with pytest.raises(edgevit.EdgevitError, match=r"tensor 'layer_1.0.block.exp_1x1.block.conv.weight' "
                                                   r"has shape \(32, 16, 1, 1\), mobilevit_v1_xs needs "
                                                   r"\(64, 16, 1, 1\)"):
        import_weights(path, "mobilevit_v1_xs", input_size=SIZE)


def test_low_latency_checkpoint_and_full_model_report_missing_and_extra_tensors(tmp_path):
    """v3_xxs_l2 has two transformer blocks in layer 4 where v3_xxs has four."""
    path = write_checkpoint(source_model("mobilevit_v3_xxs_l2")[1], tmp_path)
    with pytest.raises(edgevit.EdgevitError, match=r"lacks 26 of the 279 tensors mobilevit_v3_xxs needs .*"
                                                   r"'layer_4\.1\.global_rep\.2\.pre_norm_mha\.0\.weight'.* and "
                                                   r"has 2 it has no place for.*'layer_4.1.global_rep.2.weight'"):
        import_weights(path, "mobilevit_v3_xxs", input_size=SIZE)
