"""Official ImageNet weights in one word: ``create_model(name, weights="imagenet")``
and ``--weights imagenet``.

Each family file lists where its variants' checkpoints live
(:class:`edgevit.registry.Pretrained`, one line per variant). This module
downloads a checkpoint with the field's own clients (huggingface_hub for the
Hub, so that ``HF_ENDPOINT`` mirrors, ``HF_HOME``/``HF_HUB_CACHE``, tokens and
``HF_HUB_OFFLINE`` work as usual; ``keras.utils.get_file`` for plain URLs,
cached under ``KERAS_HOME``), verifies its sha256 before anything reads it,
imports it with :mod:`edgevit.converters` (BGR-trained weights get their stem
convolution's input channels reversed, so every model takes RGB) and caches
the Keras weights per (model, tag, input size) under ``EDGEVIT_CACHE``
(default ``~/.cache/edgevit``). A cache entry whose file does not hash to its
manifest is re-imported, never used; every file is written under a temporary
name and renamed into place, so no partial file is ever read.

``HF_HUB_OFFLINE=1`` keeps every download off the network, plain URLs
included. ``EDGEVIT_WEIGHTS_MIRROR=URL`` fetches a plain URL
``https://host/path`` from ``URL/host/path`` instead.

A download whose publisher gives no checksum (the MobileViTv3, CSWin and
T2T-ViT release files) is trusted only as far as it reads: a zip file's CRCs
are checked before its sha256 is recorded, and a cached one that does not
read as a checkpoint is deleted with its record, so the next run downloads it
again. An archive
member that would inflate beyond 64 MiB and 100 times its stored size (a
decompression bomb) is refused before anything is extracted.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from urllib.parse import urlsplit

from edgevit.errors import WRITE_FAILURES, EdgevitError, MissingPackage, cause, first_line
from edgevit.registry import IMAGENET, ModelSpec, Pretrained, Unpublished, is_imagenet  # noqa: F401  (callers' names)
from edgevit.writing import remove_stale_staging, staging_prefix

RANDOM_INIT = "random-init"  # the weights label of a model built without weights
IMAGENET_CLASSES = 1000
CACHE_ENV = "EDGEVIT_CACHE"
MIRROR_ENV = "EDGEVIT_WEIGHTS_MIRROR"
WEIGHTS_FILE, MANIFEST_FILE = "model.weights.h5", "manifest.json"
INSTEAD = ("pass --weights FILE instead (a .weights.h5 or .keras file; "
           "`edgevit import-weights CHECKPOINT --model NAME` makes one from a downloaded checkpoint)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def entry_of(spec: ModelSpec) -> Pretrained:
    """The variant's checkpoint, or one error line saying why there is none."""
    entry = spec.pretrained
    if isinstance(entry, Unpublished):
        raise EdgevitError(f"{spec.name} has no ImageNet weights edgevit can fetch: {entry.reason}")
    if entry is None:
        raise EdgevitError(f"No ImageNet weights are registered for {spec.name} yet; {INSTEAD}.")
    return entry


def weights_label(spec: ModelSpec) -> str:
    """How reports and metadata name the weights ``weights="imagenet"`` loads."""
    entry = entry_of(spec)
    return f"imagenet: {entry.tag} from {entry.where}; licence: {entry.licence}"


def random_init_hint(spec: ModelSpec, precision: str) -> str:
    """What the report of a randomly initialised model says about weights."""
    own = ("your own: --weights FILE (.weights.h5 or .keras; `edgevit import-weights` reads PyTorch "
           "checkpoints)")
    entry = spec.pretrained
    does = {"segmentation": "segments", "detection": "detects"}.get(spec.task, "classifies")
    if isinstance(entry, Pretrained):
        flag = "--" + precision.replace("_", "-")
        return (f"The weights are random: this file {does} nothing. Official weights: "
                f"`edgevit convert {flag} {spec.name} --weights imagenet` ({entry.tag}, {entry.metric} {entry.top1}%, "
                f"licence: {entry.licence}); {own}.")
    reason = f" ({entry.reason})" if isinstance(entry, Unpublished) else ""
    return (f"The weights are random: this file {does} nothing. {spec.name} has no official ImageNet "
            f"weights edgevit can fetch{reason}; {own}.")


def load_imagenet(model, spec: ModelSpec, path: Path) -> None:
    """Fill ``model`` with the variant's ImageNet weights at its input size,
    imported to ``path`` (:func:`cached_weights`); a model with another
    class count gets every weight but its classifier's."""
    from edgevit.models.common import copy_all_but_head
    from edgevit.saving import load_weights_into

    size = int(model.inputs[0].shape[1])
    if int(model.outputs[0].shape[-1]) == spec.num_classes:
        load_weights_into(model, path)
        return
    source = spec.builder(num_classes=spec.num_classes, input_size=size)
    load_weights_into(source, path)
    copy_all_but_head(source, model)


# --- the cache of imported Keras weights ----------------------------------------------------------

def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "edgevit"


def cache_folder(spec: ModelSpec, input_size: int) -> Path:
    tag = entry_of(spec).tag.replace("/", "--")
    return cache_root() / "weights" / spec.name / tag / str(input_size)


def cached_weights(spec: ModelSpec, input_size: int, log=_stderr) -> Path:
    """The variant's imported 1000-class Keras weights at ``input_size``:
    from the cache when its entry is whole, else fetched and imported."""
    entry = entry_of(spec)
    folder = cache_folder(spec, input_size)
    weights, manifest = folder / WEIGHTS_FILE, folder / MANIFEST_FILE
    expected = {"model": spec.name, "tag": entry.tag, "input_size": input_size}
    state = _cache_state(weights, manifest, expected)
    if state == "whole":
        return weights
    if state == "damaged":
        log(f"The cached ImageNet weights of {spec.name} in {folder} are damaged (their sha256 does not match "
            "the manifest): importing them again.")
    if needs_torch(entry):  # before a download that could not be read
        from edgevit.converters.checkpoints import import_torch

        try:
            import_torch()
        except MissingPackage as err:
            raise MissingPackage(f"The ImageNet weights of {spec.name} are a PyTorch checkpoint ({entry.where}): "
                                 f"{err}") from None
    with fetched_checkpoint(entry, log) as (checkpoint, checkpoint_sha256):
        from edgevit.converters.api import import_weights

        log(f"Importing {entry.tag} into {spec.name} at {input_size}x{input_size}")
        model = import_weights(checkpoint, spec.name, source=entry.naming, num_classes=spec.num_classes,
                               input_size=input_size, channel_order=entry.channel_order).model
    _write_entry(model, weights, manifest, {**expected, "source": entry.where,
                                            "checkpoint_sha256": checkpoint_sha256,
                                            "channel_order_in_checkpoint": entry.channel_order})
    return weights


def needs_torch(entry: Pretrained) -> bool:
    """Whether reading ``entry``'s checkpoint needs torch (a PyTorch
    pickle, not safetensors)."""
    from edgevit.converters.checkpoints import TORCH_SUFFIXES

    name = (entry.file or urlsplit(entry.location).path).lower()
    return name.endswith(TORCH_SUFFIXES) or (not entry.file and name.endswith(".zip"))


def _cache_state(weights: Path, manifest: Path, expected: dict) -> str:
    """'whole', 'missing' (nothing there) or 'damaged' (anything else)."""
    if not weights.exists() and not manifest.exists():
        return "missing"
    try:
        recorded = json.loads(manifest.read_text())
        if all(recorded.get(k) == v for k, v in expected.items()) and sha256_of(weights) == recorded["weights_sha256"]:
            return "whole"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return "damaged"


def _write_entry(model, weights: Path, manifest: Path, facts: dict) -> None:
    """Weights first, manifest last, each renamed into place: an entry
    without a manifest that matches its weights is never used."""
    from edgevit.converters.checkpoints import save_weights_atomic

    try:
        weights.parent.mkdir(parents=True, exist_ok=True)
        manifest.unlink(missing_ok=True)
        save_weights_atomic(model, weights)
        _write_atomic(manifest, json.dumps({**facts, "weights_sha256": sha256_of(weights)}, indent=2))
    except OSError as err:
        raise EdgevitError(f"Could not write the weights cache {str(weights.parent)!r}: "
                           f"{err.strerror or first_line(err)} (set {CACHE_ENV} to a writable folder).") from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- fetching and verifying checkpoints -----------------------------------------------------------

@contextmanager
def fetched_checkpoint(entry: Pretrained, log=_stderr):
    """(path of the verified checkpoint, its sha256); an archive member is
    extracted to a temporary folder that is removed afterwards."""
    path, digest = hub_file(entry, log) if entry.source == "hub" else url_file(entry, log)
    if entry.source == "hub":
        yield path, digest
        return
    try:
        if not entry.file:
            yield path, digest
            return
        with archive_member(path, entry.file) as member:
            try:
                yield member, digest
            except EdgevitError as err:  # name the member as the user knows it, not its temporary copy
                raise type(err)(str(err).replace(str(member), f"{entry.file} in {path}")) from None
    except EdgevitError as err:
        if entry.sha256 or isinstance(err, MissingPackage):
            raise
        # Nothing published says what the file should be: a cached download that does not read was a bad one.
        for stale in (path, _sha256_record(path)):
            stale.unlink(missing_ok=True)
        raise EdgevitError(f"{err} The download {path} (its publisher gives no checksum) was deleted: the next run "
                           "downloads it again.") from None


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _refuse_offline(what: str, where: str) -> EdgevitError:
    return EdgevitError(f"{what} is not in {where} and HF_HUB_OFFLINE=1 forbids downloading it: "
                        f"unset HF_HUB_OFFLINE, or {INSTEAD}.")


def _unreachable(what: str, host: str, err: BaseException, mirror: str) -> EdgevitError:
    return EdgevitError(f"Could not download {what} from {host} ({_why(err)}); check the connection "
                        f"(and {mirror} when you use a mirror), or {INSTEAD}.")


HF_CACHE_VARIABLES = "HF_HOME (or HF_HUB_CACHE)"  # where huggingface_hub caches, as a user sets it
# How writing a download's cache fails (a read-only or full disk, a folder that cannot be made), not the network.
_CACHE_WRITE_FAILURES = {*WRITE_FAILURES, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR}


def _download_failure(what: str, host: str, err: BaseException, cache: str, variable: str,
                      mirror: str) -> EdgevitError:
    """Why a download failed: the cache could not be written, the server
    refused access, or the network (``mirror``: the variable that points the
    download elsewhere)."""
    if isinstance(err, OSError) and err.errno in _CACHE_WRITE_FAILURES:
        return EdgevitError(f"Could not download {what} into {cache!r}: {cause(err)}; set {variable} to a writable "
                            f"folder with room, or {INSTEAD}.")
    status = getattr(getattr(err, "response", None), "status_code", None)
    if status == 403:
        return EdgevitError(f"{host} refuses access to {what} (403): its repository is gated or private; accept "
                            "its terms on its page and log in (`hf auth login`, or HF_TOKEN with read access), "
                            f"or {INSTEAD}.")
    if status == 401:
        reason = ("the token it was given (HF_TOKEN or `hf auth login`) is invalid"
                  if "Invalid credentials" in str(err) else
                  "its repository does not exist there, or is private and needs a token with access (HF_TOKEN or "
                  "`hf auth login`)")
        return EdgevitError(f"{host} does not give {what} (401): {reason}; check HF_ENDPOINT, or {INSTEAD}.")
    return _unreachable(what, host, err, mirror)


def _why(err: BaseException) -> str:
    """Why a download failed, in words: urllib's reason rather than the text
    Keras wraps it in ("URL fetch failure on URL: None -- [Errno -2] ...")."""
    import urllib.error

    inner = err.__context__
    if isinstance(inner, urllib.error.HTTPError):
        return f"HTTP {inner.code} {inner.msg}"
    if isinstance(inner, urllib.error.URLError):
        reason = inner.reason
        return reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
    return first_line(err)


def hub_file(entry: Pretrained, log=_stderr) -> tuple[Path, str]:
    """The checkpoint from the Hugging Face cache, downloaded when missing,
    once its sha256 matches the pinned one or the Hub's LFS sha256 (the
    file's etag, which huggingface_hub also names the cached blob by)."""
    import huggingface_hub
    from huggingface_hub import constants

    what = f"{entry.location}/{entry.file}"
    source = "pinned sha256" if entry.sha256 else "Hub's LFS sha256"
    try:
        cached = Path(huggingface_hub.hf_hub_download(entry.location, entry.file, local_files_only=True))
    except Exception:  # not in the cache (huggingface_hub raises several types for that)
        cached = None
    if cached is not None:
        blob = Path(os.path.realpath(cached))
        expected = entry.sha256 or _lfs_sha256(blob.name)
        if expected is not None:
            if sha256_of(cached) == expected:
                return cached, expected
            log(f"{what} in the Hugging Face cache does not match its {source}: deleted, downloading it again.")
            for stale in (cached, blob):
                stale.unlink(missing_ok=True)
        elif _offline():
            raise EdgevitError(f"{what} in the Hugging Face cache cannot be verified offline (the cache does not "
                               f"name it by its sha256): unset HF_HUB_OFFLINE, or {INSTEAD}.")
    if _offline():
        raise _refuse_offline(what, f"the Hugging Face cache ({constants.HF_HUB_CACHE})")
    try:
        meta = huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(entry.location, entry.file))
    except Exception as err:  # connection, HTTP and Hub errors alike
        raise _download_failure(what, constants.ENDPOINT, err, constants.HF_HUB_CACHE, HF_CACHE_VARIABLES,
                                "HF_ENDPOINT") from None
    expected = entry.sha256 or _lfs_sha256(meta.etag)
    if expected is None:
        raise EdgevitError(f"{constants.ENDPOINT} gives no LFS sha256 for {what}, so it cannot be verified; "
                           f"{INSTEAD}.")
    log(f"Downloading {what} from {constants.ENDPOINT}")
    try:
        from edgevit import __version__

        path = Path(huggingface_hub.hf_hub_download(entry.location, entry.file, library_name="edgevit",
                                                    library_version=__version__))
    except Exception as err:
        raise _download_failure(what, constants.ENDPOINT, err, constants.HF_HUB_CACHE, HF_CACHE_VARIABLES,
                                "HF_ENDPOINT") from None
    return path, _verified(path, expected, what, source, also_remove=[Path(os.path.realpath(path))])


def _lfs_sha256(etag: str | None) -> str | None:
    etag = (etag or "").strip('"').lower()
    return etag if _SHA256.fullmatch(etag) else None


def _verified(path: Path, expected: str, what: str, source: str, also_remove=()) -> str:
    actual = sha256_of(path)
    if actual != expected:
        for p in [path, *also_remove]:
            p.unlink(missing_ok=True)
        raise EdgevitError(f"{what} is not the published file: its sha256 is {actual}, the {source} is "
                           f"{expected}. The download was deleted; try again, or {INSTEAD}.")
    return actual


def mirrored(url: str) -> str:
    """``url`` through ``EDGEVIT_WEIGHTS_MIRROR`` when it is set."""
    mirror = os.environ.get(MIRROR_ENV)
    if not mirror:
        return url
    given = urlsplit(mirror)
    if not (given.scheme in ("http", "https") and given.netloc or given.scheme == "file" and given.path):
        raise EdgevitError(f"{MIRROR_ENV}={mirror!r} is not a URL to fetch from: give an http(s):// or file:// URL "
                           "(e.g. https://mirror.example.com/weights), or unset it.")
    parts = urlsplit(url)
    return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}"


def url_file(entry: Pretrained, log=_stderr) -> tuple[Path, str]:
    """A plain-URL checkpoint from the Keras cache (``KERAS_HOME``/edgevit),
    downloaded with ``keras.utils.get_file`` under a temporary name when
    missing and renamed into place once its sha256 is right. A publisher
    without a checksum gets its file's sha256 recorded on the first download
    and checked on every later use."""
    import keras

    url = mirrored(entry.location)
    name = Path(urlsplit(entry.location).path).name
    cache_dir, folder = _keras_cache()
    final, record = folder / name, _sha256_record(folder / name)
    expected = entry.sha256 or (record.read_text().strip() if record.exists() else None)
    if final.exists() and expected and sha256_of(final) == expected:
        return final, expected
    if _offline():
        raise _refuse_offline(url, f"the Keras cache ({folder})")
    partial = folder / f".{name}.{os.getpid()}.part"
    try:  # Keras says "Downloading data from URL" and shows the download's progress
        with redirect_stdout(_KerasProgress()):  # Keras prints its progress bar on stdout, which --json owns
            keras.utils.get_file(fname=partial.name, origin=url, cache_dir=cache_dir, cache_subdir=folder.name,
                                 force_download=True)
        if entry.sha256:
            digest = _verified(partial, entry.sha256, url, "pinned sha256")
        else:
            if entry.file or zipfile.is_zipfile(partial):  # an archive, or a checkpoint in torch's zip format
                _check_archive(partial, url)
            digest = sha256_of(partial)
            _write_atomic(record, digest + "\n")
            log(f"{name}: sha256 {digest}. Its publisher gives no checksum, so edgevit recorded this one and "
                "checks the file against it from now on.")
        os.replace(partial, final)
    except EdgevitError:
        raise
    except Exception as err:  # Keras reports any fetch failure as a bare Exception
        raise _download_failure(name, urlsplit(url).netloc, err, str(folder), "KERAS_HOME", MIRROR_ENV) from None
    finally:
        partial.unlink(missing_ok=True)
    return final, digest


def _sha256_record(download: Path) -> Path:
    """Where the sha256 of a download without a published checksum is kept."""
    return download.with_name(f"{download.name}.sha256")


def _check_archive(path: Path, url: str) -> None:
    """A downloaded zip file whose members all read back with their CRCs
    and none of which inflates like a bomb."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                _refuse_bomb(path, info)
            damaged = zf.testzip()
    except EdgevitError as err:
        raise EdgevitError(f"{err} The download from {url} was deleted; {INSTEAD}.") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as err:
        damaged = first_line(err)
    if damaged:
        raise EdgevitError(f"The download from {url} is not a whole zip archive ({damaged} does not read back); "
                           f"it was deleted: try again, or {INSTEAD}.")


def _refuse_bomb(archive: Path, info: zipfile.ZipInfo) -> None:
    from edgevit.saving import inflates_like_a_bomb

    if inflates_like_a_bomb(info):
        raise EdgevitError(f"{archive.name}: {info.filename} would inflate from {info.compress_size:,} to "
                           f"{info.file_size:,} bytes (a decompression bomb, not a checkpoint): nothing was "
                           "extracted.")


class _KerasProgress(io.TextIOBase):
    """Standard error for Keras's download bar, which writes colour codes
    whatever its output is: they are left out where the bar is not read on a
    terminal, or where NO_COLOR asks for no colour."""

    _COLOUR = re.compile(r"\x1b\[[0-9;]*m")

    def writable(self):
        return True

    def write(self, text):
        if os.environ.get("NO_COLOR") or not sys.stderr.isatty():
            text = self._COLOUR.sub("", text)
        return sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()


def _keras_cache() -> tuple[str, Path]:
    """(cache_dir to give keras.utils.get_file, the folder it then writes
    to): ``KERAS_HOME`` (default ~/.keras, /tmp/.keras when that is not
    writable, as Keras decides) / edgevit."""
    cache_dir = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    base = os.path.expanduser(cache_dir)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError:
        pass  # not writable: Keras falls back to /tmp/.keras
    if not os.access(base, os.W_OK):
        base = os.path.join("/tmp", ".keras")
    folder = Path(base) / "edgevit"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdgevitError(f"Could not make the download cache {str(folder)!r}: {cause(err)}; set KERAS_HOME to a "
                           f"writable folder, or {INSTEAD}.") from None
    return cache_dir, folder


@contextmanager
def archive_member(archive: Path, member: str):
    """``member`` of a zip archive, extracted to a temporary folder beside
    the archive (zipfile checks the member's CRC while extracting). The
    member is the one file whose path ends with ``member``, or else with its
    file name: archives differ in the folders they put around it."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n == member or n.endswith("/" + member)]
            if not names:
                base = Path(member).name
                names = [n for n in zf.namelist() if n == base or n.endswith("/" + base)]
            if len(names) != 1:
                raise EdgevitError(f"{archive.name} holds {len(names)} files named {member!r}, not one.")
            info = zf.getinfo(names[0])
            _refuse_bomb(archive, info)
            remove_stale_staging(archive.parent)  # what a killed extraction left
            with tempfile.TemporaryDirectory(prefix=staging_prefix(), dir=archive.parent) as tmp:
                target = Path(tmp) / Path(member).name
                try:
                    with zf.open(info) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                except OSError as err:
                    if err.errno is None:  # zipfile's own errors about the archive
                        raise
                    raise EdgevitError(f"Could not extract {names[0]} of {archive} into {str(archive.parent)!r}: "
                                       f"{cause(err)} (set KERAS_HOME to a folder with room).") from None
                yield target
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise EdgevitError(f"{archive.name} is not a readable zip archive ({first_line(err)}).") from None
