"""timm checkpoints -> edgevit, proven by output parity: the reference timm
model is built with random weights (every parameter and BatchNorm statistic
randomised, logits scaled to a trained model's spread), its state dict saved
as .pth or .safetensors, imported, and both models run on the same photos.

By default the first (smallest) variant of every family runs; ``-m slow``
runs every variant."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install \"edgevit[torch]\")")

from edgevit.converters import import_weights  # noqa: E402
from edgevit.converters.parity import compare, import_timm, randomize_, scale_logits_  # noqa: E402
from edgevit.converters.timm import TIMM_NAMES  # noqa: E402

from edgevit.data.sample_photos import sample_batch  # noqa: E402
from edgevit.registry import get_spec, list_models  # noqa: E402

try:
    timm = import_timm()
except ImportError:  # pragma: no cover - timm is in the test tools
    timm = None
needs_timm = pytest.mark.skipif(timm is None, reason="timm is not installed (scripts/install-test-tools.sh)")

TOLERANCE = 1e-4
REGISTERED = set(list_models())
ALL = [n for n in TIMM_NAMES if n in REGISTERED]
FIRST_OF_FAMILY = list({get_spec(n).family: n for n in reversed(ALL)}.values())
# MobileViT runs at 224 by default: the last stage is then 7x7, off the 2x2
# patch grid, so the bilinear resize paths are checked too.
DEFAULT_SIZE = {"mobilevit_v1": 224, "mobilevit_v2": 224,
                # Swin at 64: v1's first stages padded to whole windows and shifted, v2's first shifted
                "swin": 64, "swinv2": 64}
# timm builds these for any input size (no img_size argument)
INPUT_SIZE_FREE = {"mobilevit_v1", "mobilevit_v2", "pvt_v2"}


def reference(name, photos, seed=0, **kwargs):
    ref = timm.create_model(TIMM_NAMES[name], pretrained=False, **kwargs)
    randomize_(ref, seed)
    scale_logits_(ref, ref.get_classifier(), photos)
    return ref.eval()


def save(state_dict, path):
    if path.suffix == ".safetensors":
        from edgevit.converters.checkpoints import write_safetensors

        write_safetensors({k: v.numpy() for k, v in state_dict.items()}, path)
    else:
        torch.save(state_dict, path)


def check_parity(tmp_path, name, suffix=".pth", input_size=None, photos=None):
    pre = get_spec(name).preprocessing_at(input_size)
    photos = sample_batch(pre, 4) if photos is None else photos
    sized = get_spec(name).family not in INPUT_SIZE_FREE
    ref = reference(name, photos, img_size=pre.input_size) if sized else reference(name, photos)
    path = tmp_path / f"{TIMM_NAMES[name]}{suffix}"
    save(ref.state_dict(), path)
    result = import_weights(path, name, tmp_path / "out.weights.h5", input_size=input_size)
    assert result.report["source"] == "timm"
    parity = compare(ref, result.model, photos)
    print(f"PARITY timm {name} input={pre.input_size} {suffix} {parity}")
    assert parity["max_abs_diff"] <= TOLERANCE, parity
    assert parity["logit_std"] > 1.0
    return result


@needs_timm
@pytest.mark.parametrize("name", FIRST_OF_FAMILY)
def test_timm_parity_smallest_of_each_family(tmp_path, name):
    """.safetensors for the v1 (read without torch), .pth for the others."""
    suffix = ".safetensors" if name == "mobilevit_v1_xxs" else ".pth"
    check_parity(tmp_path, name, suffix, input_size=DEFAULT_SIZE.get(get_spec(name).family))


@needs_timm
@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_timm_parity(tmp_path, name):
    check_parity(tmp_path, name)


@needs_timm
@pytest.mark.skipif("vit_tiny16" not in REGISTERED, reason="ViT not registered")
@pytest.mark.parametrize("size", [160, pytest.param(288, marks=pytest.mark.slow)])
def test_position_embedding_resampled_like_timm(tmp_path, size):
    """A 224 checkpoint imported at another input size equals timm's own
    model at that size loading the same checkpoint (timm resamples the
    position embedding bicubically with antialiasing, class token kept)."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    pre = get_spec("vit_tiny16").preprocessing_at(size)
    photos = sample_batch(pre, 4)
    trained = reference("vit_tiny16", sample_batch(get_spec("vit_tiny16").preprocessing, 4))
    ref = timm.create_model(TIMM_NAMES["vit_tiny16"], img_size=size).eval()
    ref.load_state_dict(checkpoint_filter_fn(trained.state_dict(), ref))
    save(trained.state_dict(), tmp_path / "vit224.pth")
    result = import_weights(tmp_path / "vit224.pth", "vit_tiny16", input_size=size)
    assert result.report["resampled"] == [f"pos_embed (1, 197, 192) -> (1, {1 + (size // 16) ** 2}, 192)"]
    parity = compare(ref, result.model, photos)
    print(f"PARITY timm vit_tiny16 224->{size} {parity}")
    assert parity["max_abs_diff"] <= TOLERANCE, parity


@needs_timm
@pytest.mark.shared_data
def test_timm_parity_on_imagenet_photos(tmp_path, shared_data):
    from edgevit.data.images import load_images
    from edgevit.data.listing import list_images

    name = "mobilevit_v2_050"
    photos, _ = load_images(list_images(shared_data / "imagenet-sample"), get_spec(name).preprocessing, limit=8)
    check_parity(tmp_path, name, photos=photos)
