"""ml-cvnets and MobileViTv3 DeepLabV3 checkpoints (cvnets naming) -> edgevit
DeepLabV3, proven against the official code's logits.

The official segmenters were built once outside the project from
apple/ml-cvnets d38a116 with micronDLA/MobileViTv3 d381beb's MobileViTv3-v1
files (``deeplabv3_mobilevit_v3_xxs``: its VOC config, cvnets v0.1) and from
apple/ml-cvnets 84d992f (``deeplabv3_mobilevit_v2_050``: its VOC config,
width 0.5, with the auxiliary head), BatchNorm as in evaluation. Every
tensor of their state dicts got :func:`seeded_tensor`'s value for its name,
the classifier conv was scaled so the logits spread like a trained model's
(std 3), and the raw logits (the classifier conv's output, before the
upsampling, NHWC) on one sample photo at 128x128 were stored in
``tests/data/cvnets_<variant>.npz`` with the photo (uint8, RGB; the v0.1
model was given it as BGR, as its releases were trained), the classifier's
scale and the count and hash of the state dict's tensor names and shapes
(auxiliary head aside). The tests write those same weights as a checkpoint
in the official naming, import it and compare.
"""
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")

import edgevit  # noqa: E402
from edgevit.converters import import_weights  # noqa: E402
from edgevit.converters.parity import keras_logits  # noqa: E402
from edgevit.models.common import copy_all_but_head  # noqa: E402
from tests.official_checkpoints import (names_and_shapes_hash, seeded_tensor, state_dict_in,  # noqa: E402
                                        write_checkpoint)

TOLERANCE = 1e-4
SIZE = 128
DATA = Path(__file__).parent / "data"
# variant -> (checkpoint file name as published, the classifier's module path there)
RELEASES = {
    "deeplabv3_mobilevit_v3_xxs": ("checkpoint_ema_best.pt", "seg_head.classifier.classifier.block.conv"),
    "deeplabv3_mobilevit_v2_050": ("deeplabv3-mobilevitv2-0.5.pt", "seg_head.classifier.block.conv"),
}
# ml-cvnets v0.2's auxiliary head on layer 4 (192 channels at width 0.5), as its VOC checkpoints hold it
AUX_HEAD_V2_050 = {"seg_head.aux_head.0.block.conv.weight": (128, 192, 3, 3),
                   **{f"seg_head.aux_head.0.block.norm.{leaf}": (128,)
                      for leaf in ("weight", "bias", "running_mean", "running_var")},
                   "seg_head.aux_head.2.block.conv.weight": (21, 128, 1, 1),
                   "seg_head.aux_head.2.block.conv.bias": (21,)}
# ml-cvnets v0.1's classifier module (Apple's v1 VOC files), beside its dropout and upsampling
V01_CLASSIFIER = "seg_head.classifier.classifier."


def reference(name):
    with np.load(DATA / f"cvnets_{name}.npz") as stored:
        return {key: stored[key] for key in stored.files}


def official_checkpoint(tmp_path, name):
    """The reference's weights in the release's naming, written as the release is."""
    filename, classifier = RELEASES[name]
    ref = reference(name)
    names = {key.replace("seg_head.classifier.block.conv", classifier): value.shape
             for key, value in state_dict_in(edgevit.create_model(name, input_size=SIZE), "cvnets").items()}
    state_dict = {key: seeded_tensor(key, shape) for key, shape in names.items()}
    assert names_and_shapes_hash(state_dict) == (int(ref["tensors"]), str(ref["names_hash"]))
    for leaf in ("weight", "bias"):
        state_dict[f"{classifier}.{leaf}"] *= ref["classifier_scale"]
    if name == "deeplabv3_mobilevit_v2_050":
        state_dict.update({key: seeded_tensor(key, shape) for key, shape in AUX_HEAD_V2_050.items()})
    return write_checkpoint(state_dict, tmp_path / filename), ref


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> (checkpoint path, reference, import result), each imported once."""
    done = {}

    def get(name):
        if name not in done:
            path, ref = official_checkpoint(tmp_path_factory.mktemp(name), name)
            done[name] = path, ref, import_weights(path, name, input_size=SIZE)
        return done[name]
    return get


@pytest.mark.parametrize("name,trained_on", [("deeplabv3_mobilevit_v3_xxs", "BGR"),
                                             ("deeplabv3_mobilevit_v2_050", "RGB")])
def test_raw_logits_equal_the_official_segmenters(imported, name, trained_on):
    _, ref, result = imported(name)
    assert result.report["source"] == "cvnets" and result.report["num_classes"] == 21
    assert result.report["channel_order"].startswith(trained_on)
    assert result.report["tensors"] == int(ref["tensors"])
    want, got = ref["logits"], keras_logits(result.model, ref["pixels"].astype(np.float32) / 255)
    assert want.shape == got.shape == (1, SIZE // 16, SIZE // 16, 21)
    diff = float(np.abs(want - got).max())
    print(f"PARITY cvnets {name} max_abs_diff={diff:.2e} logit_std={want.std():.2f}")
    assert diff <= TOLERANCE and want.std() > 1.0
    assert (want.argmax(-1) == got.argmax(-1)).all()


def test_v2_checkpoints_need_the_dilated_blocks_they_were_trained_with(imported, tmp_path):
    """ml-cvnets dilates layer 5's block at output stride 16; the same weights
    in transformers' undilated arithmetic miss the official logits by far,
    and a weights file, which cannot say so, is refused; a model file keeps it."""
    name = "deeplabv3_mobilevit_v2_050"
    path, ref, result = imported(name)
    assert result.report["options"] == {"dilate_blocks": True}
    undilated = edgevit.create_model(name, input_size=SIZE)
    copy_all_but_head(result.model, undilated)
    pixels = ref["pixels"].astype(np.float32) / 255
    assert np.abs(keras_logits(undilated, pixels) - ref["logits"]).max() > 0.1

    weights = tmp_path / "seg.weights.h5"
    with pytest.raises(edgevit.EdgevitError, match=r"trained with dilate_blocks=True, which a weights file does "
                                                   r"not record .* -o deeplabv3_mobilevit_v2_050\.keras"):
        import_weights(path, name, weights, input_size=SIZE)
    assert not weights.exists()
    model_file = tmp_path / "seg.keras"
    import_weights(path, name, model_file, input_size=SIZE)
    from edgevit.saving import load_model, resolve_model

    np.testing.assert_allclose(keras_logits(load_model(model_file), pixels), ref["logits"], atol=TOLERANCE)
    resized, _ = resolve_model(str(model_file), input_size=64)  # a rebuild keeps the switch
    assert resized.get_layer("layer_5.1.local_rep.conv_3x3.conv").dilation_rate == (2, 2)
    # so does the registered model given the file as its weights (`--weights seg.keras`)
    np.testing.assert_allclose(keras_logits(edgevit.create_model(name, input_size=SIZE, weights=str(model_file)),
                                            pixels), ref["logits"], atol=TOLERANCE)
    with pytest.raises(edgevit.EdgevitError, match=r"seg\.keras computes with dilate_blocks=True; it cannot be "
                                                   r"built with dilate_blocks=False\.$"):
        edgevit.create_model(name, input_size=SIZE, weights=str(model_file), dilate_blocks=False)
    assert undilated.get_layer("layer_5.1.local_rep.conv_3x3.conv").dilation_rate == (1, 1)


def test_dilate_blocks_is_for_v2_based_backbones():
    with pytest.raises(edgevit.EdgevitError, match="dilate_blocks is for MobileViT v2-based backbones"):
        edgevit.create_model("deeplabv3_mobilevit_v3_xxs", input_size=SIZE, dilate_blocks=True)
    with pytest.raises(edgevit.EdgevitError, match="dilate_blocks must be True or False"):
        edgevit.create_model("deeplabv3_mobilevit_v2_050", input_size=SIZE, dilate_blocks=2)


def test_an_apple_v1_voc_checkpoint_imports_through_the_cli_with_every_tensor_used(tmp_path):
    """deeplabv3_mobilevit_xxs.pt as ml-cvnets v0.1 writes it: its classifier
    one level down (seg_head.classifier.classifier) and PyTorch's BatchNorm
    counters beside the statistics; the command places every tensor but the
    counters and the model it writes computes as the source does."""
    from tests.helpers import run_json

    name, size = "deeplabv3_mobilevit_v1_xxs", 64
    source = edgevit.create_model(name, input_size=size)
    state_dict = {key.replace("seg_head.classifier.", V01_CLASSIFIER, 1): value
                  for key, value in state_dict_in(source, "cvnets").items()}
    counters = {key.replace("running_mean", "num_batches_tracked"): np.array(1000, np.int64)
                for key in state_dict if key.endswith(".running_mean")}
    for key in ("encoder.conv_1.block.conv.weight", "encoder.layer_3.1.global_rep.0.pre_norm_mha.1.qkv_proj.weight",
                "encoder.layer_5.1.fusion.block.conv.weight",
                "seg_head.aspp.aspp_layer.convs.4.aspp_pool.conv_1x1.block.conv.weight",
                f"{V01_CLASSIFIER}block.conv.bias"):
        assert key in state_dict, key
    checkpoint = write_checkpoint({**state_dict, **counters}, tmp_path / "deeplabv3_mobilevit_xxs.pt")
    weights = tmp_path / "seg.weights.h5"
    report = run_json("import-weights", checkpoint, "--model", name, "--input-size", size, "-o", weights, "--json")
    assert (report["source"], report["num_classes"], report["options"]) == ("cvnets", 21, {})
    assert report["channel_order"].startswith("BGR")
    assert report["tensors"] == len(state_dict) and report["ignored"] == len(counters) > 30
    pixels = np.random.default_rng(0).random((1, size, size, 3), dtype=np.float32)
    want = keras_logits(source, pixels)
    for w in source.weights:  # the same model, emptied and filled from the written file
        w.assign(np.zeros(w.shape, w.dtype))
    source.load_weights(weights)
    np.testing.assert_allclose(keras_logits(source, pixels), want, atol=1e-5)
