"""MLP-Mixer and ResMLP: exact sizes, serialisation, deployment rules."""
import numpy as np
import pytest

import edgevit
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.registry import get_spec
from tests.helpers import COSINE_FLOOR, assert_deployable, export_variant, round_trip_outputs, zero_initialisers

# timm (1000 classes, 224x224): mixer_*_224, resmlp_*_224.
OFFICIAL_PARAMS = {
    "mixer_s16": 18_528_264, "mixer_b16": 59_880_472,
    "resmlp_12": 15_350_872, "resmlp_24": 30_020_680, "resmlp_36": 44_690_488,
}
SLOW_COUNT = {"mixer_b16", "resmlp_36"}
SMALLEST = ["mixer_s16", "resmlp_12"]
SMALL_SIZE = 32


def test_registry_holds_the_mlp_variants():
    assert sorted(edgevit.list_models("mixer_*") + edgevit.list_models("resmlp_*")) == sorted(OFFICIAL_PARAMS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_COUNT else n
                                  for n in sorted(OFFICIAL_PARAMS)])
def test_parameter_count_equals_timm(name):
    with zero_initialisers():
        model = edgevit.create_model(name)
    assert count_params(model) == OFFICIAL_PARAMS[name]
    assert model.name == name and get_spec(name).default_input_size == 224


@pytest.mark.parametrize("name", SMALLEST)
def test_smallest_variant_round_trips_and_converts(tmp_path, name):
    """Output shape, .keras round trip, the int8 file under the deployment
    rules (every precision: the slow matrix). The head is not zero-initialised (timm's is), so the
    random-init logits are informative."""
    model = edgevit.create_model(name, num_classes=10, input_size=SMALL_SIZE)
    x = np.random.default_rng(1).random((2, SMALL_SIZE, SMALL_SIZE, 3), dtype="float32")
    out = round_trip_outputs(tmp_path, model, x)
    assert out.shape == (2, 10) and np.abs(out).max() > 0
    report = export_variant(tmp_path, name, "int8", SMALL_SIZE, model=model)
    assert_deployable(report)
    assert report["agreement"]["cosine_mean"] > COSINE_FLOOR["int8"], report["agreement"]
    if name.startswith("resmlp"):
        # affine normalisation: no MEAN/RSQRT except the final pooling
        assert report["op_histogram"].get("MEAN") == 1 and "RSQRT" not in report["op_histogram"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OFFICIAL_PARAMS))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix_at_default_size(tmp_path, name, precision):
    report = export_variant(tmp_path, name, precision, 224)
    assert_deployable(report)
    assert report["agreement"]["cosine_mean"] > COSINE_FLOOR[precision], report["agreement"]
