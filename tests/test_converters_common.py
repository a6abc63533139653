"""Checkpoint reading, errors, position-embedding resampling, the
``edgevit import-weights`` command and what ``edgevit info`` says."""
import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import edgevit
from edgevit.converters import import_weights, sources_for
from edgevit.converters.api import SOURCES, importers_for, targets_for
from edgevit.converters.checkpoints import read_safetensors, write_safetensors
from edgevit.converters.layouts import resample_pos_embed
from edgevit.converters.registry import IMPORTERS
from edgevit.converters.rules import export_state_dict
from edgevit import EdgevitError
from edgevit.cli import main
from edgevit.resample import resample_grid

SMALL = dict(input_size=64)


@pytest.fixture(scope="module")
def v3_checkpoint(tmp_path_factory):
    """A cvnets-named MobileViTv3-XXS state dict as .safetensors and the model it came from."""
    model = edgevit.create_model("mobilevit_v3_xxs", **SMALL)
    importer = importers_for("mobilevit_v3")["cvnets"]
    state = export_state_dict(targets_for(model, importer))
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint_ema_best.safetensors"
    write_safetensors(state, path)
    return path, state, model


def test_safetensors_round_trip_keeps_dtypes_and_widens_bf16(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int64),
               "c": np.array([0.5, -2.0], np.float16)}
    write_safetensors(tensors, tmp_path / "t.safetensors")
    back = read_safetensors(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(back["a"], tensors["a"])
    assert back["b"].dtype == np.int64 and back["c"].dtype == np.float32
    # bf16: the upper 16 bits of a float32
    values = np.array([1.5, -3.25, 1e-3], np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, len(bits)]}}).encode()
    (tmp_path / "bf16.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bits)
    got = read_safetensors(tmp_path / "bf16.safetensors")["x"]
    np.testing.assert_allclose(got, values, rtol=1e-2)


def test_safetensors_load_without_torch_and_pth_names_the_extra(tmp_path, v3_checkpoint):
    """In a process where torch cannot be imported (the model side of an
    import never uses torch)."""
    path, state, _ = v3_checkpoint
    (tmp_path / "x.pth").write_bytes(b"PK\x03\x04 not really")
    script = f"""
import sys
sys.modules["torch"] = None
from edgevit.converters.checkpoints import load_checkpoint
from edgevit.errors import EdgevitError
print("TENSORS", len(load_checkpoint({str(path)!r})))
try:
    load_checkpoint({str(tmp_path / 'x.pth')!r})
except EdgevitError as err:
    print("ERROR", err)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert f"TENSORS {len(state)}" in out.stdout, out.stderr[-2000:]
    assert 'ERROR Reading PyTorch checkpoints needs torch, which is not installed: pip install "edgevit[torch]"' \
        in out.stdout


def test_imported_weights_equal_the_source(v3_checkpoint):
    path, _, model = v3_checkpoint
    result = import_weights(path, "mobilevit_v3_xxs", **SMALL)
    for a, b in zip(model.weights, result.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert result.report["num_classes"] == 1000 and result.report["source"] == "cvnets"


def test_num_classes_come_from_the_checkpoint(tmp_path, v3_checkpoint):
    _, state, _ = v3_checkpoint
    state = dict(state, **{"classifier.fc.weight": state["classifier.fc.weight"][:10],
                           "classifier.fc.bias": state["classifier.fc.bias"][:10]})
    write_safetensors(state, tmp_path / "ten.safetensors")
    result = import_weights(tmp_path / "ten.safetensors", "mobilevit_v3_xxs", **SMALL)
    assert result.report["num_classes"] == 10 and result.model.outputs[0].shape[-1] == 10
    with pytest.raises(EdgevitError, match=r"tensor 'classifier.fc.weight' has shape \(10, 512\), "
                                           r"mobilevit_v3_xxs needs \(5, 512\)"):
        import_weights(tmp_path / "ten.safetensors", "mobilevit_v3_xxs", num_classes=5, **SMALL)


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("content,match", [
    (None, "does not exist"),
    (b"garbage" * 20, "not a PyTorch checkpoint, or a truncated or corrupt one"),
    ("list", "holds a list, not a state dict of tensors"),
    ("object", r"stores Python objects \(.*Opaque\) besides tensors"),
    ("truncated", "not a PyTorch checkpoint, or a truncated or corrupt one"),
])
def test_unreadable_checkpoints(tmp_path, content, match):
    path = tmp_path / "model.pth"
    if content == "list":
        _torch().save([1, 2, 3], path)
    elif content == "object":
        _torch().save({"model": Opaque()}, path)
    elif content == "truncated":
        _torch().save({"w": _torch().zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:300])
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(EdgevitError, match=match):
        import_weights(path, "mobilevit_v3_xxs", **SMALL)


class Opaque:
    pass


def test_training_checkpoint_entries_and_wrappers_are_unwrapped(tmp_path, v3_checkpoint):
    import argparse

    torch = _torch()
    _, state, model = v3_checkpoint
    wrapped = {f"module.{k}": torch.from_numpy(v) for k, v in state.items()}
    torch.save({"epoch": 3, "args": argparse.Namespace(lr=0.1), "state_dict": wrapped}, tmp_path / "ckpt.pth.tar")
    result = import_weights(tmp_path / "ckpt.pth.tar", "mobilevit_v3_xxs", **SMALL)
    assert result.report["entry"] == "state_dict" and result.report["tensors"] == 279


def test_checkpoint_of_another_architecture(tmp_path, v3_checkpoint):
    write_safetensors({"patch_embed.proj.weight": np.zeros((8, 3, 16, 16), np.float32),
                       "blocks.0.attn.qkv.weight": np.zeros((24, 8), np.float32)}, tmp_path / "vit.safetensors")
    with pytest.raises(EdgevitError, match=r"does not look like a cvnets checkpoint of mobilevit_v3_xxs: it holds "
                                           r"0% of the 279 tensor names cvnets gives mobilevit_v3_xxs \(it lacks "
                                           r"'conv_1.block.conv.weight', for one; 'patch_embed.proj.weight' is one "
                                           r"of its names that mobilevit_v3_xxs does not use\)"):
        import_weights(tmp_path / "vit.safetensors", "mobilevit_v3_xxs", **SMALL)


def test_source_the_model_does_not_take(v3_checkpoint):
    with pytest.raises(EdgevitError, match=r"mobilevit_v3_xxs imports cvnets checkpoints, not 'timm'"):
        import_weights(v3_checkpoint[0], "mobilevit_v3_xxs", source="timm")


# Layers (no antialias) and the importers (antialias) share edgevit.resample; non-square grids and
# strong downscaling reach the border clamping and the widened antialias kernel.
@pytest.mark.parametrize("grids", [((14, 14), (10, 10)), ((14, 14), (24, 24)), ((7, 7), (12, 12)),
                                   ((10, 12), (6, 5)), ((24, 9), (5, 13))])
@pytest.mark.parametrize("antialias", [True, False])
def test_grid_resampling_equals_torch_bicubic(grids, antialias):
    torch = _torch()
    import torch.nn.functional as F

    (h, w), new = grids
    grid = np.random.default_rng(0).normal(size=(h, w, 6)).astype(np.float32)
    ref = F.interpolate(torch.from_numpy(grid).permute(2, 0, 1)[None], size=new, mode="bicubic",
                        align_corners=False, antialias=antialias)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resample_grid(grid, new, antialias=antialias), ref, atol=2e-5)


def test_pos_embed_resampling_keeps_prefix_tokens():
    pe = np.random.default_rng(1).normal(size=(1, 2 + 14 * 14, 8)).astype(np.float32)
    out = resample_pos_embed(pe, (1, 2 + 10 * 10, 8), num_prefix_tokens=2)
    assert out.shape == (1, 102, 8)
    np.testing.assert_array_equal(out[:, :2], pe[:, :2])


def test_every_declared_checkpoint_format_has_an_importer():
    """``edgevit info`` lists ModelSpec.checkpoint_formats: each one must import."""
    missing = [(name, fmt) for name in edgevit.list_models() for fmt in edgevit.get_spec(name).checkpoint_formats
               if fmt not in sources_for(name)]
    assert not missing


def test_cli_source_choices_are_the_registered_sources():
    importers_for("vit")  # loads every importer module
    assert {imp.source for imp in IMPORTERS.values()} == set(SOURCES)


# --- CLI ----------------------------------------------------------------------

def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_import_writes_weights_and_prints_the_convert_command(tmp_path, v3_checkpoint):
    out = tmp_path / "mvit.weights.h5"
    code, stdout, stderr = run("import-weights", str(v3_checkpoint[0]), "--model", "mobilevit_v3_xxs",
                               "--input-size", "64", "-o", str(out))
    assert code == 0, stderr
    assert out.is_file() and not list(tmp_path.glob(".*tmp*"))
    assert f"edgevit convert --int8 mobilevit_v3_xxs --weights {out} --input-size 64" in stdout
    reloaded = edgevit.create_model("mobilevit_v3_xxs", weights=str(out), **SMALL)
    for a, b in zip(reloaded.weights, v3_checkpoint[2].weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("args,match", [
    (["missing.pth", "--model", "mobilevit_v3_xxs"], "Checkpoint 'missing.pth' does not exist."),
    (["CKPT", "--model", "mobilevit_v3_xxs", "-o", "out.h5"], "must end in .weights.h5"),
    (["CKPT", "--model", "mobilevit_v3_xxx"], "Unknown model 'mobilevit_v3_xxx'"),
])
def test_cli_errors_are_one_clean_line(v3_checkpoint, args, match):
    args = [str(v3_checkpoint[0]) if a == "CKPT" else a for a in args]
    code, _, stderr = run("import-weights", *args)
    assert code == 1 and stderr.startswith("error: ") and match in stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1
