"""create_model passes builder arguments (drop rates) on to the family
builder as timm's does, and turns an argument a family does not take into
one clean error; the registry's catalog (read without TensorFlow) says what
the family modules declare and what the built models count."""
import keras
import numpy as np
import pytest

import edgevit
from edgevit.info import MACS_RECORDED_UP_TO_PARAMETERS, count_params
from edgevit.layers import DropPath, drop_path_rates
from edgevit.registry import get_spec

# One variant per family with stochastic depth, at a small valid input size.
DROP_PATH_VARIANTS = {"deit_tiny": 32, "convit_tiny": 32, "crossvit_tiny": 120, "cvt_13": 32, "pit_ti": 32,
                      "mixer_s16": 32, "resmlp_12": 32, "deepvit_s": 32, "pvt_v2_b0": 32, "cswin_tiny": 64,
                      "t2t_vit_7": 32}


def layer_rates(model, cls) -> dict[str, float]:
    return {layer.name: layer.rate for layer in model.layers if isinstance(layer, cls)}


def test_every_variant_takes_builder_arguments():
    for name in edgevit.list_models():
        assert get_spec(name).options, name


def test_drop_path_rate_reaches_every_block_and_changes_nothing_at_inference():
    keras.utils.set_random_seed(0)
    model = edgevit.create_model("vit_tiny16", num_classes=5, input_size=32, drop_path_rate=0.1)
    keras.utils.set_random_seed(0)
    plain = edgevit.create_model("vit_tiny16", num_classes=5, input_size=32)
    rates = layer_rates(model, DropPath)
    expected = drop_path_rates(0.1, 12)
    assert "blocks.0.drop_path1" not in rates  # timm's rule gives block 0 the rate 0
    for i in range(1, 12):
        assert rates[f"blocks.{i}.drop_path1"] == rates[f"blocks.{i}.drop_path2"] == pytest.approx(expected[i])
    assert rates["blocks.11.drop_path2"] == pytest.approx(0.1) and len(rates) == 22
    assert not layer_rates(plain, DropPath)
    assert count_params(model) == count_params(plain)
    x = np.random.default_rng(0).random((2, 32, 32, 3), dtype="float32")
    np.testing.assert_array_equal(model.predict(x, verbose=0), plain.predict(x, verbose=0))


@pytest.mark.parametrize("name", sorted(DROP_PATH_VARIANTS))
def test_every_family_with_stochastic_depth_forwards_drop_path_rate(name):
    model = edgevit.create_model(name, num_classes=5, input_size=DROP_PATH_VARIANTS[name], drop_path_rate=0.2)
    rates = layer_rates(model, DropPath)
    assert rates and max(rates.values()) == pytest.approx(0.2) and min(rates.values()) > 0.0


def test_mobilevit_dropout_arguments_replace_the_official_defaults():
    default = edgevit.create_model("mobilevit_v1_xxs", num_classes=5, input_size=64)
    dropouts = layer_rates(default, keras.layers.Dropout)
    assert dropouts["head.drop"] == 0.1 and dropouts["layer_3.1.global_rep.0.drop_attn"] == 0.1
    model = edgevit.create_model("mobilevit_v1_xxs", num_classes=5, input_size=64, dropout=0.2,
                                 ffn_dropout=0.05, classifier_dropout=0.0)
    dropouts = layer_rates(model, keras.layers.Dropout)
    assert "head.drop" not in dropouts
    assert dropouts["layer_3.1.global_rep.0.drop_attn"] == 0.2
    assert dropouts["layer_3.1.global_rep.0.mlp.drop1"] == 0.05
    v2 = edgevit.create_model("mobilevit_v2_050", num_classes=5, input_size=64, classifier_dropout=0.2)
    assert layer_rates(v2, keras.layers.Dropout)["head.drop"] == 0.2
    assert count_params(model) == count_params(default)


@pytest.mark.parametrize("name, options, message", [
    ("vit_tiny16", {"foo": 1}, "vit_tiny16 has no argument foo: it takes drop_path_rate"),
    ("mobilevit_v1_xxs", {"drop_path_rate": 0.1}, "mobilevit_v1_xxs has no argument drop_path_rate"),
    ("vit_tiny16", {"drop_path_rate": 1.5}, "drop_path_rate must be a probability"),
    ("mobilevit_v2_050", {"dropout": "0.1"}, "dropout must be a probability"),
])
def test_an_argument_the_family_does_not_take_is_one_clean_error(name, options, message):
    with pytest.raises(edgevit.EdgevitError, match=message):
        edgevit.create_model(name, input_size=64, **options)


# --- the catalog: what `edgevit list` and `info` read without importing TensorFlow --------------------

REFRESH = "rewrite it with `python -m edgevit.info` (see edgevit/info.py)"


def test_the_catalog_holds_every_variant_as_its_family_declares_it():
    from edgevit.registry import catalog_entry, declared_specs, read_catalog

    declared, catalog = declared_specs(), read_catalog()
    assert sorted(catalog) == sorted(declared), REFRESH
    stale = [name for name, spec in declared.items()
             if {k: v for k, v in catalog[name].items() if k not in ("parameters", "macs")} != catalog_entry(spec)]
    assert not stale, f"the catalog differs from the family modules for {stale}: {REFRESH}"
    uncounted = [name for name, entry in catalog.items() if entry["parameters"] is None
                 or (entry["macs"] is None) != (entry["parameters"] > MACS_RECORDED_UP_TO_PARAMETERS)]
    assert not uncounted, f"counts missing or out of place for {uncounted}: {REFRESH}"


def test_a_spec_read_from_the_catalog_builds_its_model():
    spec = get_spec("vit_tiny16")
    model = spec.builder(num_classes=3, input_size=32)
    assert model.name == "vit_tiny16" and model.outputs[0].shape[-1] == 3


@pytest.mark.parametrize("name", ["mobilevit_v3_xxs", "vit_tiny16"])
def test_recorded_counts_are_the_counts_of_the_built_model(name):
    from edgevit.info import counts

    spec = get_spec(name)
    assert counts(name, spec.default_input_size) == (spec.parameters, spec.macs), REFRESH


@pytest.mark.slow
@pytest.mark.parametrize("name", edgevit.list_models())
def test_every_recorded_parameter_count_is_the_built_models(name):
    spec = get_spec(name)
    assert count_params(edgevit.create_model(name)) == spec.parameters, REFRESH


def test_create_model_from_python_prints_nothing_of_tensorflows_start_up(tmp_path):
    """The CLI hid TensorFlow's native chatter (CUDA probes, CPU features,
    oneDNN notes) and the library printed it: a script that builds a model
    prints only its own output."""
    import subprocess
    import sys

    script = "import edgevit; print(edgevit.create_model('mobilevit_v3_xxs', num_classes=2, input_size=32).name)"
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "mobilevit_v3_xxs\n" and proc.stderr == "", proc.stderr
