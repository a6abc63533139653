"""Official CSWin Transformer checkpoints (microsoft/CSWin-Transformer).

The official code is not importable here (it is not a package, and needs
einops and an old timm), so each test writes a checkpoint in the official
naming from edgevit's own random weights, laid out like the release files
(a training checkpoint whose ``state_dict_ema`` holds the weights), and
imports it back. The tensor names and shapes are pinned to the official
code: ``OFFICIAL`` holds, per variant, the number of tensors and a hash of
the sorted ``name:shape`` list of the state dict of the official model,
built from microsoft/CSWin-Transformer f111ae2 ``models/cswin.py``.

Against that official code, with every parameter randomised and the logits
scaled to std 3, the imported models agree to <= 8.3e-6 max abs logit
difference on all six variants at their default sizes
(converters/README.md).
"""
import functools

import pytest

import edgevit
from tests.official_checkpoints import assert_imports_back, names_and_shapes_hash, state_dict_in, write_checkpoint

OFFICIAL = {
    "cswin_tiny": (418, "24df181b8272fa30"), "cswin_small": (656, "ae7e385b22257aca"),
    "cswin_base": (656, "91aded48435fbadf"), "cswin_large": (656, "fa747295f713f004"),
    "cswin_base_384": (656, "91aded48435fbadf"), "cswin_large_384": (656, "fa747295f713f004"),
}
DEFAULT = ["cswin_tiny"]
SIZE = 64  # no tensor shape depends on the input size


@functools.cache
def source_model(name):
    """A random-init model and its weights in the official naming (built once)."""
    model = edgevit.create_model(name, input_size=SIZE)
    return model, state_dict_in(model, "official")


def round_trip(tmp_path, name):
    """As the release files hold them: the EMA weights of a training checkpoint."""
    source, state_dict = source_model(name)
    assert names_and_shapes_hash(state_dict) == OFFICIAL[name]
    path = write_checkpoint(state_dict, tmp_path / f"{name}.pth", entry="state_dict_ema")
    assert_imports_back(path, source, "official", OFFICIAL[name][0], SIZE)


@pytest.mark.parametrize("name", DEFAULT)
def test_official_round_trip_with_official_names(tmp_path, name):
    round_trip(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(OFFICIAL) - set(DEFAULT)))
def test_official_round_trip_every_variant(tmp_path, name):
    round_trip(tmp_path, name)


def test_every_cswin_variant_has_an_official_name_table():
    assert sorted(OFFICIAL) == edgevit.list_models("cswin*")


def test_official_names_read_like_the_official_code():
    """The stem is an unnamed Sequential there; the two stripe branches of
    a block each hold half of the channels' LePE, the last stage one."""
    state_dict = source_model("cswin_tiny")[1]
    keys = {"stage1_conv_embed.0.weight": (64, 3, 7, 7), "stage1_conv_embed.2.weight": (64,),
            "stage1.0.qkv.weight": (192, 64), "stage1.0.attns.0.get_v.weight": (32, 1, 3, 3),
            "stage1.0.attns.1.get_v.bias": (32,), "stage3.20.mlp.fc2.weight": (256, 1024),
            "merge3.conv.weight": (512, 256, 3, 3), "stage4.0.attns.0.get_v.weight": (512, 1, 3, 3),
            "norm.weight": (512,), "head.weight": (1000, 512)}
    assert {k: tuple(state_dict[k].shape) for k in keys} == keys
    assert "stage4.0.attns.1.get_v.weight" not in state_dict

