"""Hugging Face MobileViT / MobileViTV2 segmentation checkpoints -> edgevit
DeepLabV3, proven by output parity against transformers'
``MobileViTForSemanticSegmentation`` / ``MobileViTV2ForSemanticSegmentation``
with random weights (every parameter and BatchNorm statistic randomised,
logits scaled to a trained model's spread), saved as ``model.safetensors``
or ``pytorch_model.bin`` beside the model's ``config.json``. The raw logits
(NHWC at the output stride, before any upsampling) are compared; for v1
the reference reads the images as BGR, as its releases were trained, and
the imported model the same images as RGB."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                                          "(scripts/install-test-tools.sh)")

from edgevit.converters import import_weights  # noqa: E402
from edgevit.converters.hf_mobilevit import fuse_qkv  # noqa: E402
from edgevit.converters.hf_mobilevit import transformers_reference  # noqa: E402
from edgevit.converters.parity import keras_logits, randomize_, scale_logits_, torch_logits  # noqa: E402
from edgevit.data.sample_photos import sample_batch  # noqa: E402
from edgevit.errors import EdgevitError  # noqa: E402
from edgevit.registry import get_spec  # noqa: E402

TOLERANCE = 1e-4
SIZE = 128  # layer 5 at 8x8 (output stride 16): small and fast, every branch of ASPP still reads the map


def check_parity(tmp_path, name, filename):
    photos = sample_batch(get_spec(name).preprocessing.at_size(SIZE), 2)
    bgr = "_v1_" in name
    seen = np.ascontiguousarray(photos[..., ::-1]) if bgr else photos  # what the reference takes
    ref = transformers_reference(name)
    randomize_(ref)
    scale_logits_(ref, ref.segmentation_head.classifier.convolution, seen)
    path = tmp_path / filename
    if path.suffix == ".safetensors":
        ref.save_pretrained(tmp_path)
    else:  # transformers 5 writes safetensors only; older releases' files are pytorch_model.bin
        ref.config.save_pretrained(tmp_path)
        torch.save(ref.state_dict(), path)
    assert path.is_file() and (tmp_path / "config.json").is_file()
    result = import_weights(path, name, input_size=SIZE)
    assert result.report["source"] == "huggingface" and result.report["num_classes"] == 21
    assert result.report["channel_order"].startswith("BGR" if bgr else "RGB")
    want, got = torch_logits(ref, seen), keras_logits(result.model, photos)
    assert want.shape == got.shape == (2, SIZE // 16, SIZE // 16, 21)
    diff = float(np.abs(want - got).max())
    print(f"PARITY huggingface {name} {filename} max_abs_diff={diff:.2e} logit_std={want.std():.2f}")
    assert diff <= TOLERANCE
    assert want.std() > 1.0
    assert (want.argmax(-1) == got.argmax(-1)).mean() > 0.99


def test_v1_parity_from_safetensors(tmp_path):
    check_parity(tmp_path, "deeplabv3_mobilevit_v1_xxs", "model.safetensors")


def test_v2_parity_from_pytorch_model_bin(tmp_path):
    check_parity(tmp_path, "deeplabv3_mobilevit_v2_050", "pytorch_model.bin")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deeplabv3_mobilevit_v1_xs", "deeplabv3_mobilevit_v1_s",
                                  "deeplabv3_mobilevit_v2_100"])
def test_parity_of_the_released_variants(tmp_path, name):
    check_parity(tmp_path, name, "model.safetensors")


def test_separate_query_key_value_read_as_one_qkv_tensor():
    q, k, v = (np.full((4, 4), i, np.float32) for i in range(3))
    prefix = "mobilevit.encoder.layer.2.transformer.layer.0.attention.attention"
    fused = fuse_qkv({f"{prefix}.query.weight": q, f"{prefix}.key.weight": k, f"{prefix}.value.weight": v,
                      "other": q})
    assert sorted(fused) == [f"{prefix}.qkv.weight", "other"]
    assert fused[f"{prefix}.qkv.weight"][:, 0].tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_a_checkpoint_of_another_variant_is_one_clear_error(tmp_path):
    ref = transformers_reference("deeplabv3_mobilevit_v1_xs")
    ref.save_pretrained(tmp_path)
    with pytest.raises(EdgevitError, match="shape"):
        import_weights(tmp_path / "model.safetensors", "deeplabv3_mobilevit_v1_xxs", input_size=64)


def test_import_weights_command_reads_a_saved_transformers_model(tmp_path):
    from click.testing import CliRunner

    from edgevit.cli import main

    transformers_reference("deeplabv3_mobilevit_v1_xxs").save_pretrained(tmp_path)
    out = tmp_path / "seg.weights.h5"
    result = CliRunner().invoke(main, ["import-weights", str(tmp_path / "model.safetensors"), "--model",
                                       "deeplabv3_mobilevit_v1_xxs", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    assert f"Next: edgevit convert --int8 deeplabv3_mobilevit_v1_xxs --weights {out}\n" in result.output


@pytest.mark.parametrize("name", ["deeplabv3_mobilevit_v1_xxs", "deeplabv3_mobilevit_v2_050"])
def test_output_stride_8_dilates_where_transformers_does(tmp_path, monkeypatch, name):
    """cvnets' newer recipe (stride 8, rates 12/24/36) as a config: layers 4
    and 5 keep the map's size, layer 5's inverted residual is dilated, the
    MobileViT blocks are not; the same weights give transformers' logits."""
    import dataclasses

    from edgevit.models import deeplabv3
    from edgevit.models.common import copy_all_but_head

    photos = sample_batch(get_spec(name).preprocessing.at_size(SIZE), 2)
    seen = np.ascontiguousarray(photos[..., ::-1]) if "_v1_" in name else photos
    ref = transformers_reference(name, output_stride=8, atrous_rates=(12, 24, 36))
    randomize_(ref)
    scale_logits_(ref, ref.segmentation_head.classifier.convolution, seen)
    ref.save_pretrained(tmp_path)
    imported = import_weights(tmp_path / "model.safetensors", name, input_size=SIZE).model
    monkeypatch.setitem(deeplabv3.CONFIGS, name, dataclasses.replace(deeplabv3.CONFIGS[name], output_stride=8,
                                                                      atrous_rates=(12, 24, 36)))
    model = deeplabv3.build_deeplabv3(name, 21, SIZE)
    copy_all_but_head(imported, model)  # every weight: the same 21 classes
    want, got = torch_logits(ref, seen), keras_logits(model, photos)
    assert want.shape == got.shape == (2, SIZE // 8, SIZE // 8, 21)
    diff = float(np.abs(want - got).max())
    print(f"PARITY huggingface {name} output stride 8 max_abs_diff={diff:.2e}")
    assert diff <= TOLERANCE and want.std() > 1.0
