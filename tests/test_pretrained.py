"""``weights="imagenet"`` / ``--weights imagenet``: download, verification,
import, channel order and cache, against loopback servers (tests/loopback.py)
that serve checkpoints made here from small edgevit models in timm, cvnets
and Hugging Face naming. The "logits equal the reference" checks compare the
downloaded model with the model the checkpoint was written from (the
importers' parity with timm, cvnets and transformers is proven in
tests/test_converters_*.py).

huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE when it
is imported, so the in-process tests set its constants; the subprocess test
sets the environment variables themselves, as a user would.
"""
import contextlib
import hashlib
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import edgevit
from edgevit import EdgevitError
from edgevit.cli import main
from edgevit.converters.api import import_weights, importers_for, targets_for
from edgevit.converters.checkpoints import write_safetensors
from edgevit.converters.rules import export_state_dict
from edgevit.pretrained import cache_folder, cached_weights
from edgevit.registry import COCO_MAP, Pretrained, Unpublished, get_spec
from tests.loopback import LoopbackServer

SIZE = 64  # every tensor of these checkpoints has the same shape at any input size
V1 = "mobilevit_v1_xxs"          # timm/mobilevit_xxs.cvnets_in1k, safetensors, RGB
V3 = "mobilevit_v3_xxs"          # MobileViTv3 release zip, cvnets naming, BGR
PHOTOS = np.random.default_rng(0).random((2, SIZE, SIZE, 3), dtype=np.float32)


def use_loopback(mp, server, root):
    """Point huggingface_hub, the caches and the download mirror at
    ``server`` and at empty folders under ``root``."""
    from huggingface_hub import constants

    mp.setattr(constants, "ENDPOINT", server.url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_CACHE", str(root / "hf"))
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    mp.setenv("EDGEVIT_CACHE", str(root / "edgevit"))
    mp.setenv("KERAS_HOME", str(root / "keras"))
    mp.setenv("EDGEVIT_WEIGHTS_MIRROR", server.url)


@pytest.fixture
def servers(tmp_path, monkeypatch):
    """A loopback Hub + download mirror, and empty caches, for this test."""
    server = LoopbackServer()
    use_loopback(monkeypatch, server, tmp_path)
    yield server
    server.close()


def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def state_dict(model, source: str) -> dict:
    """``model``'s weights as a checkpoint of ``source`` (in its channel order)."""
    importer = importers_for(get_spec(model.name).family)[source]
    return export_state_dict(targets_for(model, importer))


def safetensors_bytes(tensors: dict, tmp_path) -> bytes:
    path = tmp_path / "ckpt.safetensors"
    write_safetensors(tensors, path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def v1_checkpoint(tmp_path_factory):
    """A random mobilevit_v1_xxs and its weights as timm's Hub copy (bytes)."""
    model = edgevit.create_model(V1, input_size=SIZE)
    return model, safetensors_bytes(state_dict(model, "timm"), tmp_path_factory.mktemp("v1"))


def serve_v1(server, v1_checkpoint):
    """Serve the checkpoint as timm/mobilevit_xxs.cvnets_in1k; returns its model."""
    model, content = v1_checkpoint
    entry = get_spec(V1).pretrained
    server.hub_file(entry.location, entry.file, content)
    return model


@pytest.fixture(scope="module")
def v1_caches(v1_checkpoint, tmp_path_factory):
    """The Hugging Face and edgevit caches after one real download and
    import of the v1 checkpoint (copied into tests that start warm)."""
    root = tmp_path_factory.mktemp("warm")
    server = LoopbackServer()
    with pytest.MonkeyPatch.context() as mp:
        use_loopback(mp, server, root)
        serve_v1(server, v1_checkpoint)
        cached_weights(get_spec(V1), SIZE)
    server.close()
    return root


def warm(v1_caches, tmp_path):
    for name in ("hf", "edgevit"):
        shutil.copytree(v1_caches / name, tmp_path / name, symlinks=True)


def logits(model, x):
    return np.asarray(model(x, training=False))


def test_hub_download_is_verified_imported_cached_and_used_offline(servers, v1_checkpoint, tmp_path, monkeypatch):
    source = serve_v1(servers, v1_checkpoint)
    model = edgevit.create_model(V1, input_size=SIZE, weights="imagenet")
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)
    assert servers.hits("model.safetensors") == 1
    manifest = json.loads((cache_folder(get_spec(V1), SIZE) / "manifest.json").read_text())
    assert manifest["tag"] == "mobilevit_xxs.cvnets_in1k" and manifest["input_size"] == SIZE
    assert manifest["checkpoint_sha256"] == hashlib.sha256(v1_checkpoint[1]).hexdigest()
    # second use: from the cache, no request at all, even offline
    offline(monkeypatch)
    requests = len(servers.requests)
    again = edgevit.create_model(V1, input_size=SIZE, weights="imagenet")
    for a, b in zip(model.weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # without the Keras weights, offline: imported again from the (verified) Hugging Face cache
    shutil.rmtree(tmp_path / "edgevit")
    assert cached_weights(get_spec(V1), SIZE).is_file()
    assert len(servers.requests) == requests
    with pytest.raises(EdgevitError, match=r"timm/mobilevit_xs.cvnets_in1k/model.safetensors is not in the Hugging "
                                           r"Face cache \(.*\) and HF_HUB_OFFLINE=1 forbids downloading it: unset "
                                           r"HF_HUB_OFFLINE, or pass --weights FILE instead"):
        cached_weights(get_spec("mobilevit_v1_xs"), SIZE)


def test_tampered_hub_file_is_refused_and_deleted(servers, v1_checkpoint, tmp_path):
    entry = get_spec(V1).pretrained
    genuine = v1_checkpoint[1]
    tampered = bytearray(genuine)
    tampered[-4:] = b"\x00\x00\x80\x7f"  # the last float becomes +inf
    sha256 = servers.hub_file(entry.location, entry.file, bytes(tampered), advertised=genuine)
    with pytest.raises(EdgevitError, match=rf"{entry.location}/{entry.file} is not the published file: its sha256 is "
                                           rf"[0-9a-f]{{64}}, the Hub's LFS sha256 is {sha256}\. The download was "
                                           r"deleted; try again, or pass --weights FILE instead"):
        edgevit.create_model(V1, input_size=SIZE, weights="imagenet")
    assert not [p for p in (tmp_path / "hf").rglob("*") if p.is_file() and "blobs" in p.parts]
    assert not (tmp_path / "edgevit").exists()


def test_damaged_cache_entry_is_replaced_not_used(servers, v1_caches, tmp_path, capsys):
    warm(v1_caches, tmp_path)
    weights = cache_folder(get_spec(V1), SIZE) / "model.weights.h5"
    with open(weights, "r+b") as f:  # a partial write
        f.truncate(weights.stat().st_size // 2)
    assert cached_weights(get_spec(V1), SIZE) == weights
    assert "are damaged" in capsys.readouterr().err
    manifest = json.loads((weights.parent / "manifest.json").read_text())
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == manifest["weights_sha256"]
    assert not servers.requests  # imported again from the verified Hugging Face cache


def test_unreachable_checkpoint_is_one_clear_error(servers):
    with pytest.raises(EdgevitError, match=rf"Could not download timm/mobilevit_xxs.cvnets_in1k/model.safetensors "
                                           rf"from {servers.url} \(.*\); check the connection \(and HF_ENDPOINT"):
        edgevit.create_model(V1, input_size=SIZE, weights="imagenet")  # nothing served


def test_an_unreachable_release_file_says_why_in_words_once(servers, monkeypatch, capsys):
    """It said "(URL fetch failure on URL: None -- [Errno 111] Connection refused)", after "Downloading" twice."""
    from edgevit.pretrained import url_file

    entry = get_spec(V3).pretrained
    with pytest.raises(EdgevitError, match=r"Could not download mobilevitv3_XXS_e300_7098.zip from 127.0.0.1:\d+ "
                                           r"\(HTTP 404 [^)]*\); check the connection"):
        url_file(entry)  # nothing served
    assert capsys.readouterr().err.count("Downloading") == 1
    monkeypatch.setenv("EDGEVIT_WEIGHTS_MIRROR", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(EdgevitError, match=r"from 127.0.0.1:9 \(Connection refused\); check the connection") as err:
        url_file(entry)
    # a release file's mirror is edgevit's own; HF_ENDPOINT points the Hub's files elsewhere, not this one
    message = str(err.value)
    assert "(and EDGEVIT_WEIGHTS_MIRROR when you use a mirror)" in message and "HF_ENDPOINT" not in message


def test_imagenet_weights_that_cannot_come_fail_before_the_model_is_built(servers, monkeypatch):
    """Offline, or a PyTorch checkpoint without torch installed: one error
    line before anything is built (it took 20 s of building first) or
    downloaded (a checkpoint nothing here could read)."""
    import dataclasses

    import edgevit.registry
    from edgevit.converters import checkpoints
    from edgevit.errors import MissingPackage

    def not_to_be_built(**options):
        raise AssertionError("the model was built before its weights were there")

    def no_torch():
        raise MissingPackage('Reading PyTorch checkpoints needs torch, which is not installed: pip install '
                             '"edgevit[torch]"')

    for name in (V1, V3):
        spec = dataclasses.replace(get_spec(name), builder=not_to_be_built)
        monkeypatch.setattr(edgevit.registry, "get_spec", lambda _, spec=spec: spec)
        with monkeypatch.context() as mp:
            offline(mp)
            with pytest.raises(EdgevitError, match="HF_HUB_OFFLINE=1 forbids downloading it"):
                edgevit.create_model(name, input_size=SIZE, weights="imagenet")
    monkeypatch.setattr(checkpoints, "import_torch", no_torch)
    with pytest.raises(MissingPackage, match=r"The ImageNet weights of mobilevit_v3_xxs are a PyTorch "
                                             r"checkpoint \(.*\): Reading PyTorch checkpoints needs torch"):
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")  # a release zip of a torch.save checkpoint
    assert not servers.requests


def release_zip(model, folder: str, tmp_path) -> bytes:
    """A MobileViTv3 release archive: FOLDER/checkpoint_ema_best.pt in cvnets
    naming (torch.save as the release; safetensors bytes when torch is
    missing, which the importer recognises by content)."""
    tensors = state_dict(model, "cvnets")
    try:
        import torch

        buffer = io.BytesIO()
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, buffer)
        checkpoint = buffer.getvalue()
    except ImportError:
        checkpoint = safetensors_bytes(tensors, tmp_path)
    return release_archive(folder, checkpoint, config="model: mobilevit_v3\n")


def release_archive(folder: str, checkpoint: bytes, config: str | None = None) -> bytes:
    """A MobileViTv3 release zip: FOLDER/checkpoint_ema_best.pt (and its
    config.yaml when given)."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        if config is not None:
            zf.writestr(f"{folder}/config.yaml", config)
        zf.writestr(f"{folder}/checkpoint_ema_best.pt", checkpoint)
    return archive.getvalue()


@pytest.fixture(scope="module")
def v3_release(tmp_path_factory):
    """A random mobilevit_v3_xxs and its release archive (bytes)."""
    model = edgevit.create_model(V3, input_size=SIZE)
    return model, release_zip(model, get_spec(V3).pretrained.tag, tmp_path_factory.mktemp("v3"))


def test_release_checkpoint_of_a_bgr_model_takes_rgb(servers, v3_release, tmp_path, capsys):
    source, archive_bytes = v3_release
    entry = get_spec(V3).pretrained
    assert entry.channel_order == "BGR" and entry.source == "url"
    servers.plain_file(entry.location, archive_bytes)
    model = edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)
    # on RGB pixels it computes what the checkpoint's own network (its tensors read as they are)
    # computes on the BGR pixels it was trained on
    member = tmp_path / "checkpoint_ema_best.pt"
    member.write_bytes(zipfile.ZipFile(io.BytesIO(archive_bytes)).read(f"{entry.tag}/checkpoint_ema_best.pt"))
    as_is = import_weights(member, V3, input_size=SIZE, channel_order="RGB").model
    np.testing.assert_allclose(logits(model, PHOTOS), logits(as_is, PHOTOS[..., ::-1]), atol=1e-5)
    assert np.abs(logits(model, PHOTOS) - logits(as_is, PHOTOS)).max() > 1e-3
    # the release gives no checksum: the first download's sha256 is recorded and checked from then on
    assert "Its publisher gives no checksum" in capsys.readouterr().err
    archive = tmp_path / "keras" / "edgevit" / f"{entry.tag}.zip"
    recorded = (archive.parent / f"{archive.name}.sha256").read_text().strip()
    assert recorded == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert not [p for p in archive.parent.iterdir() if p.name.startswith(".")]  # no partial download left


def test_pinned_hash_refuses_another_file(servers, v3_release, tmp_path, monkeypatch):
    import dataclasses

    from edgevit import registry

    spec = get_spec(V3)
    pinned = dataclasses.replace(spec.pretrained, sha256="0" * 64)
    monkeypatch.setitem(registry._REGISTRY, V3, dataclasses.replace(spec, pretrained=pinned))
    servers.plain_file(pinned.location, v3_release[1])
    with pytest.raises(EdgevitError, match=r"is not the published file: its sha256 is [0-9a-f]{64}, the pinned "
                                           r"sha256 is 0{64}\. The download was deleted"):
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert not list((tmp_path / "keras" / "edgevit").iterdir())


@pytest.mark.parametrize("status, error_code, server_message, message", [
    (403, "GatedRepo", "", "refuses access to timm/mobilevit_xxs.cvnets_in1k/model.safetensors (403): its repository "
                           "is gated or private; accept its terms on its page and log in"),
    (401, "RepoNotFound", "", "does not give timm/mobilevit_xxs.cvnets_in1k/model.safetensors (401): its repository "
                              "does not exist there, or is private and needs a token with access (HF_TOKEN"),
    (401, "", "Invalid credentials in Authorization header", "does not give timm/mobilevit_xxs.cvnets_in1k/"
              "model.safetensors (401): the token it was given (HF_TOKEN or `hf auth login`) is invalid"),
])
def test_a_hub_refusal_says_what_access_is_missing(servers, status, error_code, server_message, message):
    """Each said only "4xx Client Error." and "check the connection"."""
    entry = get_spec(V1).pretrained
    servers.hub_refusal(entry.location, entry.file, status, error_code, server_message)
    with pytest.raises(EdgevitError, match=rf"^{servers.url} {re.escape(message)}"):
        edgevit.create_model(V1, input_size=SIZE, weights="imagenet")


@pytest.mark.parametrize("cache", ["not a folder", "full"])
def test_an_unwritable_hugging_face_cache_is_not_called_a_connection_problem(servers, v1_checkpoint, tmp_path,
                                                                            monkeypatch, cache):
    from huggingface_hub import constants

    serve_v1(servers, v1_checkpoint)
    if cache == "not a folder":
        (tmp_path / "hf-file").write_text("")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-file"))
        reason = "Not a directory"
    else:
        reason = "File too large: it exceeds the file-size limit of this shell (`ulimit -f`)"
    with file_size_limit(100_000 if cache == "full" else None), pytest.raises(EdgevitError) as raised:
        edgevit.create_model(V1, input_size=SIZE, weights="imagenet")
    assert str(raised.value).startswith(f"Could not download timm/mobilevit_xxs.cvnets_in1k/model.safetensors into "
                                        f"{constants.HF_HUB_CACHE!r}: {reason}; set HF_HOME (or HF_HUB_CACHE) to a "
                                        "writable folder with room"), raised.value


def test_a_full_keras_cache_is_not_called_a_connection_problem(servers, v3_release, tmp_path):
    entry = get_spec(V3).pretrained
    servers.plain_file(entry.location, v3_release[1])
    with file_size_limit(len(v3_release[1]) // 2), pytest.raises(EdgevitError) as raised:
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert str(raised.value).startswith(f"Could not download {entry.tag}.zip into "
                                        f"'{tmp_path / 'keras' / 'edgevit'}': File too large: it exceeds the "
                                        "file-size limit of this shell (`ulimit -f`); set KERAS_HOME"), raised.value
    assert not list((tmp_path / "keras" / "edgevit").iterdir())


@contextlib.contextmanager
def file_size_limit(limit):
    """`ulimit -f`: writes past ``limit`` bytes fail with EFBIG (None: no limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_cut_download_without_a_checksum_is_not_recorded(servers, v3_release, tmp_path, capsys, monkeypatch):
    """A first download that was cut short was recorded as the file, and every
    later run failed on it without asking the server again."""
    entry = get_spec(V3).pretrained
    servers.plain_file(entry.location, v3_release[1][:-2000])
    with pytest.raises(EdgevitError, match=r"is not a whole zip archive .* it was deleted: try again"):
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert not list((tmp_path / "keras" / "edgevit").iterdir())
    servers.plain_file(entry.location, v3_release[1])
    monkeypatch.setenv("NO_COLOR", "1")
    capsys.readouterr()
    edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert servers.hits(f"{entry.tag}.zip") == 2
    progress = capsys.readouterr().err
    assert "Downloading" in progress and "\x1b[" not in progress  # Keras's bar printed colour codes regardless


def test_a_cached_download_without_a_checksum_that_does_not_read_is_deleted(servers, v3_release, tmp_path):
    """It failed forever as "corrupt", naming a temporary copy that no longer
    existed, and nothing said which cached file to delete."""
    entry = get_spec(V3).pretrained
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"{entry.tag}/checkpoint_ema_best.pt", b"not a checkpoint")
    servers.plain_file(entry.location, archive.getvalue())
    cached = tmp_path / "keras" / "edgevit" / f"{entry.tag}.zip"
    with pytest.raises(EdgevitError) as raised:
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert f"{entry.tag}/checkpoint_ema_best.pt in {cached}" in str(raised.value)
    assert str(raised.value).endswith(f"The download {cached} (its publisher gives no checksum) was deleted: the "
                                      "next run downloads it again.")
    assert not list(cached.parent.iterdir())
    servers.plain_file(entry.location, v3_release[1])
    edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert servers.hits(f"{entry.tag}.zip") == 2


def test_a_cached_plain_checkpoint_without_a_checksum_that_does_not_read_is_deleted(servers, v3_release, tmp_path,
                                                                                   monkeypatch):
    """CSWin's and T2T-ViT's release files are checkpoints themselves, not archives."""
    import dataclasses

    from edgevit import registry

    spec = get_spec(V3)
    plain = dataclasses.replace(spec.pretrained, location="https://example.com/releases/v3.pt", file="")
    monkeypatch.setitem(registry._REGISTRY, V3, dataclasses.replace(spec, pretrained=plain))
    servers.plain_file(plain.location, b"<html>rate limited</html>")  # a proxy's page, say
    cached = tmp_path / "keras" / "edgevit" / "v3.pt"
    with pytest.raises(EdgevitError, match=rf"The download {re.escape(str(cached))} \(its publisher gives no "
                                           r"checksum\) was deleted: the next run downloads it again.$"):
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert not list(cached.parent.iterdir())
    checkpoint = zipfile.ZipFile(io.BytesIO(v3_release[1])).read(f"{spec.pretrained.tag}/checkpoint_ema_best.pt")
    servers.plain_file(plain.location, checkpoint)
    edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert servers.hits("v3.pt") == 2 and cached.is_file()


def test_an_archive_member_that_inflates_like_a_bomb_is_not_extracted(tmp_path):
    """A 1 MB zip whose member inflated to 1 GiB filled the cache disk."""
    from edgevit.pretrained import archive_member

    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("release/checkpoint_ema_best.pt", b"\0" * (65 << 20))
    with pytest.raises(EdgevitError, match=r"^bomb.zip: release/checkpoint_ema_best.pt would inflate from [\d,]+ to "
                                           r"68,157,440 bytes \(a decompression bomb, not a checkpoint\): nothing "
                                           r"was extracted.$"):
        with archive_member(tmp_path / "bomb.zip", "checkpoint_ema_best.pt"):
            pass
    assert [p.name for p in tmp_path.iterdir()] == ["bomb.zip"]


def test_an_extraction_that_fills_the_disk_is_one_error_and_leaves_nothing(tmp_path):
    from edgevit.pretrained import archive_member

    with zipfile.ZipFile(tmp_path / "release.zip", "w") as zf:
        zf.writestr("release/checkpoint_ema_best.pt", b"\1" * 200_000)
    with file_size_limit(100_000), pytest.raises(EdgevitError, match=r"^Could not extract release/checkpoint_ema_best"
                                                                     r".pt of .*release.zip into .*: File too large"):
        with archive_member(tmp_path / "release.zip", "checkpoint_ema_best.pt"):
            pass
    assert [p.name for p in tmp_path.iterdir()] == ["release.zip"]


@pytest.mark.parametrize("variable, value, message", [
    ("EDGEVIT_WEIGHTS_MIRROR", "mirror.example.com", "EDGEVIT_WEIGHTS_MIRROR='mirror.example.com' is not a URL to "
                                                     "fetch from: give an http(s):// or file:// URL"),
    ("KERAS_HOME", "a-file", "Could not make the download cache '{tmp}/a-file/edgevit': Not a directory; set "
                             "KERAS_HOME to a writable folder"),
])
def test_a_download_setting_that_cannot_work_is_one_error(servers, tmp_path, monkeypatch, variable, value, message):
    """A mirror without a scheme was fetched "from" an empty host; KERAS_HOME
    naming a file ended in a NotADirectoryError traceback."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(variable, value if variable != "KERAS_HOME" else str(tmp_path / value))
    with pytest.raises(EdgevitError) as raised:
        edgevit.create_model(V3, input_size=SIZE, weights="imagenet")
    assert str(raised.value).startswith(message.format(tmp=tmp_path)), raised.value
    assert not servers.requests


def test_hugging_face_naming(servers, tmp_path):
    """microsoft/cvt-13 in transformers' naming."""
    source = edgevit.create_model("cvt_13", input_size=SIZE)
    entry = get_spec("cvt_13").pretrained
    servers.hub_file(entry.location, entry.file, safetensors_bytes(state_dict(source, "huggingface"), tmp_path))
    model = edgevit.create_model("cvt_13", input_size=SIZE, weights="imagenet")
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-4)


def test_segmentation_release_in_transformers_naming(servers, tmp_path):
    """apple/deeplabv3-mobilevit-xx-small: pytorch_model.bin in transformers'
    naming (query, key and value projected apart), trained on BGR; 21 VOC
    classes, and another class count keeps every weight but the classifier's."""
    torch = pytest.importorskip("torch", reason="the release is a PyTorch pickle")
    name = "deeplabv3_mobilevit_v1_xxs"
    source = edgevit.create_model(name, input_size=SIZE)
    tensors = {}
    for key, value in state_dict(source, "huggingface").items():
        if ".attention.attention.qkv." in key:  # as the release holds them
            for part, third in zip(("query", "key", "value"), np.split(value, 3)):
                tensors[key.replace(".qkv.", f".{part}.")] = third
        else:
            tensors[key] = value
    buffer = io.BytesIO()
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, buffer)
    entry = get_spec(name).pretrained
    assert (entry.location, entry.file, entry.channel_order, entry.metric) == (
        "apple/deeplabv3-mobilevit-xx-small", "pytorch_model.bin", "BGR", "VOC mIoU")
    servers.hub_file(entry.location, entry.file, buffer.getvalue())
    model = edgevit.create_model(name, input_size=SIZE, weights="imagenet")
    assert tuple(model.output.shape) == (None, SIZE // 16, SIZE // 16, 21)
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)
    five = edgevit.create_model(name, num_classes=5, input_size=SIZE, weights="imagenet")
    by_path = {w.path: w.numpy() for w in source.weights}
    for w in five.weights:
        if not w.path.startswith("classifier.conv/"):
            np.testing.assert_array_equal(w.numpy(), by_path[w.path], err_msg=w.path)
    assert servers.hits("pytorch_model.bin") == 1


def torch_bytes(tensors: dict) -> bytes:
    torch = pytest.importorskip("torch", reason="the release is a PyTorch pickle")
    buffer = io.BytesIO()
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, buffer)
    return buffer.getvalue()


def test_segmentation_release_of_mobilevitv3_in_cvnets_naming(servers, tmp_path):
    """mobilevitv3_XXS_voc_e50_7404.zip: checkpoint_ema_best.pt in ml-cvnets
    v0.1's segmentation naming (the classifier conv under
    seg_head.classifier.classifier), trained on BGR, non-commercial."""
    name = "deeplabv3_mobilevit_v3_xxs"
    source = edgevit.create_model(name, input_size=SIZE)
    tensors = {k.replace("seg_head.classifier.", "seg_head.classifier.classifier."): v
               for k, v in state_dict(source, "cvnets").items()}
    entry = get_spec(name).pretrained
    assert (entry.tag, entry.channel_order, entry.metric, entry.top1) == (
        "mobilevitv3_XXS_voc_e50_7404", "BGR", "VOC mIoU", 74.04)
    assert entry.licence.startswith("non-commercial")
    servers.plain_file(entry.location, release_archive(entry.tag, torch_bytes(tensors)))
    model = edgevit.create_model(name, input_size=SIZE, weights="imagenet")
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)


def test_cvnets_zoo_segmenter_is_built_with_the_dilation_it_was_trained_with(servers, tmp_path):
    """deeplabv3-mobilevitv2-0.5.pt from Apple's model zoo (a plain .pt with
    the auxiliary head): the model ``weights="imagenet"`` builds dilates
    layer 5's block as ml-cvnets does."""
    name = "deeplabv3_mobilevit_v2_050"
    source = edgevit.create_model(name, input_size=SIZE, dilate_blocks=True)
    tensors = {**state_dict(source, "cvnets"), "seg_head.aux_head.2.block.conv.bias": np.zeros(21, np.float32)}
    entry = get_spec(name).pretrained
    assert (entry.tag, entry.channel_order, entry.metric, entry.naming) == (
        "deeplabv3-mobilevitv2-0.5", "RGB", "VOC mIoU", "cvnets")
    servers.plain_file(entry.location, torch_bytes(tensors))
    model = edgevit.create_model(name, input_size=SIZE, weights="imagenet")
    assert model.get_layer("layer_5.1.local_rep.conv_3x3.conv").dilation_rate == (2, 2)
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)


def test_v2_based_segmentation_release_of_mobilevitv3_is_built_dilated_and_takes_rgb(servers, tmp_path):
    """mobilevitv3_voc_0_5_0.zip: checkpoint_ema_best.pt of MobileViTv3-v2 on
    ml-cvnets v0.2 (its classifier as seg_head.classifier, the auxiliary head
    beside it), trained on RGB with layer 5's block dilated; non-commercial."""
    name = "deeplabv3_mobilevit_v3_050"
    source = edgevit.create_model(name, input_size=SIZE, dilate_blocks=True)
    tensors = {**state_dict(source, "cvnets"), "seg_head.aux_head.2.block.conv.bias": np.zeros(21, np.float32)}
    assert "seg_head.classifier.block.conv.weight" in tensors
    entry = get_spec(name).pretrained
    assert (entry.tag, entry.channel_order, entry.metric, entry.top1, entry.naming) == (
        "mobilevitv3_voc_0_5_0", "RGB", "VOC mIoU", 76.48, "cvnets")
    assert entry.licence.startswith("non-commercial")
    servers.plain_file(entry.location, release_archive(entry.tag, torch_bytes(tensors)))
    model = edgevit.create_model(name, input_size=SIZE, weights="imagenet")
    assert model.get_layer("layer_5.1.local_rep.conv_3x3.conv").dilation_rate == (2, 2)
    np.testing.assert_allclose(logits(model, PHOTOS), logits(source, PHOTOS), atol=1e-5)
    assert get_spec("deeplabv3_mobilevit_v3_100").pretrained.top1 == 80.04


def test_another_class_count_gets_a_new_classifier_only(servers, v1_checkpoint, v1_caches, tmp_path):
    from edgevit.train.prepare import build_model

    warm(v1_caches, tmp_path)
    source = v1_checkpoint[0]
    messages = []
    model, _ = build_model(V1, ["ant", "bee", "wasp"], weights="imagenet", input_size=SIZE, log=messages.append)
    assert messages == ["New 3-class head on the ImageNet weights (they have 1000 classes)"]
    by_path = {w.path: w.numpy() for w in source.weights}
    for w in model.weights:
        if w.path.startswith("head.fc/"):
            assert w.shape[-1] == 3
        else:
            np.testing.assert_array_equal(w.numpy(), by_path[w.path], err_msg=w.path)


@pytest.mark.parametrize("name,where", [
    ("mixer_s16", "gs://mixer_models/gsam/Mixer-S_16.npz"),
    ("deepvit_s", "github.com/zhoudaquan/dvit_repo"),
])
def test_models_without_public_weights_say_where_they_live(name, where):
    with pytest.raises(EdgevitError, match=rf"^{name} has no ImageNet weights edgevit can fetch: .*{where}") as err:
        edgevit.create_model(name, weights="imagenet")
    assert "\n" not in str(err.value)


# --- the tables --------------------------------------------------------------------------------------

def test_every_model_has_a_pretrained_entry_and_every_entry_a_model():
    import importlib
    import pkgutil

    import edgevit.models

    names = set(edgevit.list_models())
    missing = sorted(n for n in names if not isinstance(get_spec(n).pretrained, (Pretrained, Unpublished)))
    assert not missing, f"add them to their family's PRETRAINED table: {missing}"
    for info in pkgutil.iter_modules(edgevit.models.__path__):
        table = getattr(importlib.import_module(f"edgevit.models.{info.name}"), "PRETRAINED", {})
        assert set(table) <= names, (info.name, set(table) - names)


def test_entries_name_their_licence_source_and_channel_order():
    for name in edgevit.list_models():
        entry = get_spec(name).pretrained
        if isinstance(entry, Unpublished):
            continue
        low = 15 if entry.metric == COCO_MAP else 50  # the detectors' COCO mAPs: 19.3 ... 30.21
        assert entry.licence and low < entry.top1 < 95 and entry.naming in get_spec(name).checkpoint_formats, name
        assert entry.source in ("hub", "url") and (entry.source == "url" or entry.file), name
        # cvnets v0.1 (OpenCV) trained the v1-based MobileViTv3 release and the MobileViT v1 segmenters
        # (transformers' copies) on BGR; timm's copies take RGB
        bgr = name.startswith("mobilevit_v3_") and name[len("mobilevit_v3_"):] in ("xxs", "xs", "s", "xxs_l2",
                                                                                  "xs_l2", "s_l2")
        bgr = bgr or name.startswith("deeplabv3_mobilevit_v1_") or name in (
            "deeplabv3_mobilevit_v3_xxs", "deeplabv3_mobilevit_v3_xs", "deeplabv3_mobilevit_v3_s")
        bgr = bgr or name.startswith("ssdlite_mobilevit_v1_") or name in (
            "ssdlite_mobilevit_v3_xxs", "ssdlite_mobilevit_v3_xs", "ssdlite_mobilevit_v3_s")
        assert entry.channel_order == ("BGR" if bgr else "RGB"), name
        if entry.location.startswith("https://github.com/micronDLA/"):
            assert entry.licence.startswith("non-commercial"), name


def test_timm_entries_are_timm_tags_with_timm_preprocessing():
    """Each timm entry is a tag timm publishes on the Hub, and the variant's
    registered preprocessing is the one timm evaluates that tag with."""
    import math

    from edgevit.converters.parity import import_timm

    try:
        timm = import_timm()
    except ImportError:
        pytest.skip("timm is not installed (scripts/install-test-tools.sh)")
    for name in edgevit.list_models():
        spec, entry = get_spec(name), get_spec(name).pretrained
        if not isinstance(entry, Pretrained) or entry.naming != "timm":
            continue
        cfg = timm.models.get_pretrained_cfg(entry.tag).to_dict()
        assert cfg["hf_hub_id"] == entry.location and cfg["num_classes"] == 1000, name
        pre = spec.preprocessing
        assert cfg["input_size"] == (3, pre.input_size, pre.input_size), name
        assert math.floor(pre.input_size / cfg["crop_pct"]) == pre.resize_size, name
        assert (cfg["interpolation"], tuple(cfg["mean"]), tuple(cfg["std"])) == (pre.interpolation, pre.mean,
                                                                                 pre.std), name


# --- the command line ----------------------------------------------------------------------------------

def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_list_pretrained_shows_tag_source_top1_preprocessing_and_licence():
    code, stdout, stderr = run("list", "mobilevit_v3_x*", "--pretrained", "--json")
    assert code == 0, stderr
    rows = {row["name"]: row for row in json.loads(stdout)}
    assert set(rows) == {"mobilevit_v3_xs", "mobilevit_v3_xxs", "mobilevit_v3_xs_l2", "mobilevit_v3_xxs_l2"}
    xs = rows["mobilevit_v3_xs"]
    assert xs["tag"] == "mobilevitv3_XS_e300_7671" and xs["top1"] == 76.7 and xs["checkpoint_channel_order"] == "BGR"
    assert "non-commercial" in xs["licence"] and "releases/download/v1.0.0" in xs["source"]
    assert xs["preprocessing"]["resize_size"] == 288 and xs["preprocessing"]["interpolation"] == "bilinear"
    code, stdout, _ = run("list", "--pretrained")
    assert code == 0 and "76.7%" in stdout and "non-commercial" in stdout and "mixer_s16" not in stdout
    # a detector's published mAP was measured on the whole image resized to the square, not a crop
    code, stdout, _ = run("list", "ssdlite_mobilevit_v2_100", "--pretrained")
    assert code == 0 and "whole image to 320x320 (bicubic)" in stdout and "crop" not in stdout


def test_convert_with_imagenet_weights_shows_top5_of_both_and_the_licence(servers, v1_caches, tmp_path):
    warm(v1_caches, tmp_path)
    out = tmp_path / "v1.tflite"
    code, stdout, stderr = run("convert", "--fp32", V1, "--input-size", str(SIZE), "--weights", "imagenet",
                               "--no-gpu-run", "-o", str(out), "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["weights"].startswith("imagenet: mobilevit_xxs.cvnets_in1k from https://huggingface.co/timm/")
    assert "licence: Apple ml-cvnets licence" in report["weights"] and "weights_hint" not in report
    photos = report["top5_photos"]
    assert [p["photo"] for p in photos] == ["chelsea.png", "coffee.png", "camera.png", "brick.png"]
    for p in photos:  # fp32: the same five labels, the same order
        assert [label for label, _ in p["keras"]] == [label for label, _ in p["file"]]
    assert json.loads(out.with_suffix(".json").read_text())["weights"] == report["weights"]
    assert not servers.requests


def test_offline_without_cache_is_one_error_line_and_leaves_nothing(tmp_path):
    """As a user runs it: environment variables, a fresh process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hf"), EDGEVIT_CACHE=str(tmp_path / "ev"))
    (tmp_path / "out").mkdir()
    proc = subprocess.run([sys.executable, "-m", "edgevit", "convert", "--int8", V1, "--weights", "imagenet",
                           "-o", str(tmp_path / "out" / "v1.tflite")], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.splitlines()[-1]  # after the progress line "> Building mobilevit_v1_xxs"
    assert last.startswith("error: timm/mobilevit_xxs.cvnets_in1k/model.safetensors is not in the Hugging "
                           "Face cache") and "pass --weights FILE instead" in last, proc.stderr
    assert proc.stderr.count("error") == 1 and "Traceback" not in proc.stderr
    assert not list((tmp_path / "out").iterdir()) and not (tmp_path / "ev").exists()


def test_hf_endpoint_from_the_environment(servers, v1_checkpoint, tmp_path):
    """HF_ENDPOINT as a mirror user sets it, read by huggingface_hub in a fresh process."""
    serve_v1(servers, v1_checkpoint)
    env = dict(os.environ, HF_ENDPOINT=servers.url, HF_HUB_CACHE=str(tmp_path / "hf2"),
               EDGEVIT_CACHE=str(tmp_path / "ev2"))
    env.pop("HF_HUB_OFFLINE", None)
    code = f"import edgevit; edgevit.create_model({V1!r}, input_size={SIZE}, weights='imagenet'); print('LOADED')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert "LOADED" in proc.stdout, proc.stderr[-3000:]
    assert f"from {servers.url}" in proc.stderr and (tmp_path / "ev2" / "weights" / V1).is_dir()


@pytest.mark.network
def test_real_download_recognises_a_cat_in_rgb(tmp_path, monkeypatch):
    """Opt-in (pytest -m network): timm's mobilevit_xxs.cvnets_in1k from the
    real Hub calls scikit-image's cat photo a cat, and more surely with RGB
    pixels than with BGR ones: timm's copy of Apple's (BGR-trained) weights
    takes RGB."""
    from huggingface_hub import constants

    from edgevit.data.labels import default_labels
    from edgevit.data.sample_photos import held_out_photos

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("EDGEVIT_CACHE", str(tmp_path / "edgevit"))
    model = edgevit.create_model(V1, weights="imagenet")
    names, photos = held_out_photos(get_spec(V1).preprocessing)
    cat = photos[names.index("chelsea.png")][None]
    labels = default_labels(1000)
    cats = [labels.index(name) for name in ("tabby", "tiger cat", "Egyptian cat")]

    def cat_probability(x):
        z = logits(model, x)[0]
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return p[cats].sum(), [labels[i] for i in np.argsort(-p)[:5]]

    rgb, top5 = cat_probability(cat)
    bgr, _ = cat_probability(cat[..., ::-1])
    assert set(top5) & {labels[i] for i in cats} and rgb > bgr, (top5, rgb, bgr)
