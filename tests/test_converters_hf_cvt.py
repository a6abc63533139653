"""Hugging Face CvT checkpoints -> edgevit, proven by output parity against
``transformers.CvtForImageClassification`` with random weights (every
parameter and BatchNorm statistic randomised, logits scaled to a trained
model's spread), saved as ``pytorch_model.bin`` or ``model.safetensors``."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                                          "(scripts/install-test-tools.sh)")

from edgevit.converters import import_weights  # noqa: E402
from edgevit.converters.checkpoints import write_safetensors  # noqa: E402
from edgevit.converters.hf_cvt import HF_CONFIGS  # noqa: E402
from edgevit.converters.parity import compare, randomize_, scale_logits_  # noqa: E402
from edgevit.data.sample_photos import sample_batch  # noqa: E402
from edgevit.registry import get_spec, list_models  # noqa: E402

TOLERANCE = 1e-4
ALL = [n for n in HF_CONFIGS if n in set(list_models())]


def check_parity(tmp_path, name, filename):
    photos = sample_batch(get_spec(name).preprocessing, 4)
    config = transformers.CvtConfig(num_labels=1000, **HF_CONFIGS[name])
    ref = transformers.CvtForImageClassification(config).eval()
    randomize_(ref)
    scale_logits_(ref, ref.classifier, photos)
    path = tmp_path / filename
    if path.suffix == ".safetensors":
        write_safetensors({k: v.numpy() for k, v in ref.state_dict().items()}, path)
    else:
        torch.save(ref.state_dict(), path)
    result = import_weights(path, name)
    assert result.report["source"] == "huggingface"
    parity = compare(ref, result.model, photos)
    print(f"PARITY huggingface {name} {filename} {parity}")
    assert parity["max_abs_diff"] <= TOLERANCE, parity
    assert parity["logit_std"] > 1.0


@pytest.mark.skipif("cvt_13" not in ALL, reason="CvT not registered")
def test_cvt_13_parity_from_safetensors(tmp_path):
    check_parity(tmp_path, "cvt_13", "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_cvt_parity(tmp_path, name):
    check_parity(tmp_path, name, "pytorch_model.bin")
