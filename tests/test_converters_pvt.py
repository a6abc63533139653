"""Official whai362/PVT release checkpoints of PVT v2 (``patch_embed1``,
``block1.0``, ``norm1``, ``mlp.dwconv.dwconv``).

Each test writes a checkpoint in the official naming from edgevit's own
(random) weights and imports it back. ``OFFICIAL`` holds, per variant, the
number of tensors and a hash of the sorted ``name:shape`` list of the
official model's state dict, computed by building the official models of
whai362/PVT 57e2dfa (``classification/pvt_v2.py``). Against those official
models, with random weights, the imported edgevit models agree to <= 7.6e-6
max abs logit difference (converters/README.md). With timm installed, timm's
own remapping of original checkpoints (``checkpoint_filter_fn``) must turn
the written names into timm's.
"""
import pytest

import edgevit
from tests.official_checkpoints import assert_imports_back, names_and_shapes_hash, state_dict_in, write_checkpoint

OFFICIAL = {
    "pvt_v2_b0": (178, "65106c6bd5eb0e9e"), "pvt_v2_b1": (178, "2390167ccd0a001a"),
    "pvt_v2_b2": (334, "49d0c63e01d050ea"), "pvt_v2_b2_li": (346, "60e07aca8dda0297"),
    "pvt_v2_b3": (574, "2d4833bbb4b014e4"), "pvt_v2_b4": (834, "21e7220dc695b3ff"),
    "pvt_v2_b5": (1054, "ac61b1ac96673a52"),
}
SIZE = {"pvt_v2_b2_li": 224}  # tensor shapes do not depend on the input size; _li needs a multiple of 224


@pytest.mark.parametrize("name", ["pvt_v2_b0", *[pytest.param(n, marks=pytest.mark.slow)
                                                 for n in sorted(set(OFFICIAL) - {"pvt_v2_b0"})]])
def test_official_checkpoint_round_trip(tmp_path, name):
    size = SIZE.get(name, 64)
    model = edgevit.create_model(name, input_size=size)
    state_dict = state_dict_in(model, "official")
    assert names_and_shapes_hash(state_dict) == OFFICIAL[name]
    assert_imports_back(write_checkpoint(state_dict, tmp_path / f"{name}.pth"), model, "official",
                        OFFICIAL[name][0], size)


def test_timm_maps_the_official_names_onto_its_own():
    torch = pytest.importorskip("torch")
    from edgevit.converters.parity import import_timm

    timm = import_timm()
    from timm.models.pvt_v2 import checkpoint_filter_fn

    model = edgevit.create_model("pvt_v2_b0", input_size=64)
    reference = timm.create_model("pvt_v2_b0")
    remapped = checkpoint_filter_fn({k: torch.from_numpy(v) for k, v in state_dict_in(model, "official").items()},
                                    reference)
    assert {k: tuple(v.shape) for k, v in remapped.items()} == \
        {k: tuple(v.shape) for k, v in reference.state_dict().items()}
