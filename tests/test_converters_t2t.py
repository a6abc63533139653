"""Official T2T-ViT checkpoints (yitu-opensource/T2T-ViT release ``*.pth.tar``).

The official code is not importable in tests (its repository is not a
package here), so, as for cvnets, each test writes a checkpoint in the
official naming from edgevit's own (random) weights, wrapped like a training
checkpoint of that repository (``state_dict_ema`` with DistributedDataParallel's
``module.`` prefixes), and imports it back. The names and shapes are pinned to
the official code: ``OFFICIAL`` holds, per variant, the number of tensors and
a hash of the sorted ``name:shape`` list of the official model's state dict,
computed by building the official models of yitu-opensource/T2T-ViT 0f63dc9
(``models/t2t_vit.py``) with torch 2.13 and timm 1.0.31.

Against those official models, with random weights (Performer keys and
queries at a scale where attention is not dominated by its epsilon), the
imported edgevit models agree to <= 1.1e-5 max abs logit difference
(converters/README.md).
"""
import functools
import hashlib

import numpy as np
import pytest

import edgevit
from edgevit.converters import import_weights
from edgevit.converters.api import importers_for
from edgevit.converters.rules import export_state_dict, plan
from tests.helpers import assert_same_weights, zero_initialisers

torch = pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")

OFFICIAL = {
    "t2t_vit_7": (111, "8f4cd382360b1c7e"), "t2t_vit_10": (144, "923ca2934d320428"),
    "t2t_vit_12": (166, "20224add5164e3c0"), "t2t_vit_14": (188, "a0da2fbe7adb30e3"),
    "t2t_vit_19": (243, "e2bfd233c56c7d0a"), "t2t_vit_24": (298, "35a99016c49fa407"),
    "t2t_vit_t_14": (184, "305772ba29f82860"), "t2t_vit_t_19": (239, "7beda318d7a8f049"),
    "t2t_vit_t_24": (294, "1ac7d88298434739"),
}
DEFAULT = ["t2t_vit_7"]
TOKEN_TYPES = ["t2t_vit_7", "t2t_vit_t_14"]  # a Performer and a transformer tokens-to-token module
SIZE = 32  # tensor shapes do not depend on the input size, but for the position table


def t2t_state_dict(model):
    importer = importers_for("t2t_vit")["official"]
    return export_state_dict(plan(model, importer.rules(model), "official"))


@functools.cache
def source_model(name):
    """A random-init model and its weights in the official naming (built once)."""
    model = edgevit.create_model(name, input_size=SIZE)
    return model, t2t_state_dict(model)


@functools.cache
def official_names(name):
    """The official naming and shapes of ``name``'s tensors (all-zero weights: quick to build)."""
    with zero_initialisers():
        return {k: tuple(v.shape) for k, v in t2t_state_dict(edgevit.create_model(name, input_size=SIZE)).items()}


def names_and_shapes_hash(shapes):
    """As the official model at 224 names them: the position table is the
    only tensor whose shape follows the input size."""
    dim = shapes["cls_token"][-1]
    shapes = {k: (1, 197, dim) if k == "pos_embed" else shape for k, shape in shapes.items()}
    lines = sorted(f"{k}:{shape}" for k, shape in shapes.items())
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def write_release_checkpoint(state_dict, path):
    """As the release files are: a training checkpoint with the EMA weights
    of a DistributedDataParallel model."""
    torch.save({"epoch": 309, "state_dict_ema": {f"module.{k}": torch.from_numpy(v) for k, v in state_dict.items()}},
               path)
    return path


def round_trip(tmp_path, name):
    source, state_dict = source_model(name)
    assert names_and_shapes_hash({k: tuple(v.shape) for k, v in state_dict.items()}) == OFFICIAL[name]
    path = write_release_checkpoint(state_dict, tmp_path / f"{name}.pth.tar")
    result = import_weights(path, name, input_size=SIZE)
    assert result.report["source"] == "official" and result.report["entry"] == "state_dict_ema"
    assert result.report["tensors"] == OFFICIAL[name][0]
    assert_same_weights(source, result.model)  # the Performers' directions and the position table too


@pytest.mark.parametrize("name", DEFAULT)
def test_t2t_round_trip_with_official_names(tmp_path, name):
    round_trip(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(OFFICIAL) - set(DEFAULT)))
def test_t2t_round_trip_every_variant(tmp_path, name):
    round_trip(tmp_path, name)


@pytest.mark.parametrize("name", [*TOKEN_TYPES, *(pytest.param(n, marks=pytest.mark.slow)
                                                   for n in sorted(set(OFFICIAL) - set(TOKEN_TYPES)))])
def test_every_variant_names_its_tensors_like_the_official_code(name):
    assert names_and_shapes_hash(official_names(name)) == OFFICIAL[name]


def test_every_t2t_variant_has_an_official_name_table():
    assert sorted(OFFICIAL) == edgevit.list_models("t2t_vit*")


@pytest.mark.parametrize("name,keys", [
    ("t2t_vit_7", {"tokens_to_token.attention1.kqv.weight": (192, 147), "tokens_to_token.attention1.w": (32, 64),
                   "tokens_to_token.attention2.kqv.weight": (192, 576),
                   "tokens_to_token.attention1.mlp.0.weight": (64, 64),
                   "tokens_to_token.project.weight": (256, 576), "cls_token": (1, 1, 256),
                   "blocks.0.attn.qkv.weight": (768, 256), "head.weight": (1000, 256)}),
    ("t2t_vit_t_14", {"tokens_to_token.attention1.attn.qkv.weight": (192, 147),
                      "tokens_to_token.attention1.mlp.fc1.weight": (64, 64),
                      "tokens_to_token.attention2.attn.proj.weight": (64, 64),
                      "tokens_to_token.project.weight": (384, 576)}),
])
def test_t2t_names_read_like_the_official_code(name, keys):
    shapes = official_names(name)
    assert {k: shapes[k] for k in keys} == keys
    assert "blocks.0.attn.qkv.bias" not in shapes  # no qkv bias in the official blocks


def test_projection_kernel_is_the_linear_layer_over_unfolded_patches():
    """The last soft split and its linear projection (``nn.Unfold(3, 2, 1)``
    then ``nn.Linear(C * 9, E)`` over ``(c, kh, kw)``-ordered patches) equal
    the imported 3x3 stride-2 convolution."""
    import keras

    model, state_dict = source_model("t2t_vit_7")
    weight = torch.from_numpy(state_dict["tokens_to_token.project.weight"])
    bias = torch.from_numpy(state_dict["tokens_to_token.project.bias"])
    x = np.random.default_rng(0).normal(size=(1, 8, 8, 64)).astype(np.float32)
    patches = torch.nn.functional.unfold(torch.from_numpy(x).permute(0, 3, 1, 2), 3, padding=1, stride=2)
    expected = torch.nn.functional.linear(patches.transpose(1, 2), weight, bias).numpy()
    pad, conv = model.get_layer("tokens_to_token.project.pad"), model.get_layer("tokens_to_token.project")
    got = np.asarray(conv(pad(keras.ops.convert_to_tensor(x))))
    np.testing.assert_allclose(got.reshape(1, 16, -1), expected, atol=1e-5)


def test_position_table_of_another_input_size_is_resampled_like_the_official_loader(tmp_path):
    """A checkpoint of the 224 model imported at 32 px: the grid part of
    ``pos_embed`` is resampled as the official ``resize_pos_embed`` does
    (``F.interpolate`` bicubic, no antialiasing), the class-token entry kept."""
    state_dict = dict(source_model("t2t_vit_7")[1])
    table = np.random.default_rng(0).normal(size=(1, 197, 256)).astype(np.float32)
    state_dict["pos_embed"] = table
    result = import_weights(write_release_checkpoint(state_dict, tmp_path / "t2t_vit_7.pth.tar"), "t2t_vit_7",
                            input_size=SIZE)
    assert result.report["resampled"] == ["pos_embed (1, 197, 256) -> (1, 5, 256)"]
    grid = torch.from_numpy(table[:, 1:]).reshape(1, 14, 14, -1).permute(0, 3, 1, 2)
    grid = torch.nn.functional.interpolate(grid, size=(2, 2), mode="bicubic").permute(0, 2, 3, 1)
    expected = np.concatenate([table[:, :1], grid.reshape(1, 4, -1).numpy()], axis=1)
    got = result.model.get_layer("pos_embed").pos_embed.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)  # float64 resampling vs torch float32


def test_checkpoint_without_a_block_names_what_it_lacks(tmp_path):
    """A checkpoint one block short (a shallower variant's, or a truncated file)."""
    state_dict = {k: v for k, v in source_model("t2t_vit_7")[1].items() if not k.startswith("blocks.6.")}
    path = write_release_checkpoint(state_dict, tmp_path / "short.pth.tar")
    with pytest.raises(edgevit.EdgevitError, match=r"lacks 11 of the 111 tensors t2t_vit_7 needs .*'blocks\.6\."):
        import_weights(path, "t2t_vit_7", input_size=SIZE)
