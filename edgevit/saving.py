"""Saving and loading edgevit models and weights, with clear errors.

A model trained by edgevit knows its class names: they are saved inside the
``.keras`` archive (in its metadata.json, which Keras writes and never reads
back), attached to the loaded model and written by the export into the labels
and metadata.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path

from edgevit.data.labels import label_problem
from edgevit.errors import WRITE_FAILURES, EdgevitError, cause, file_problem, first_line
from edgevit.registry import ModelSpec, create_model, get_spec, is_imagenet
from edgevit.writing import staged

MODEL_SUFFIX = ".keras"
# What edgevit adds to a .keras file: a key of the archive's metadata.json. It
# was a member of its own, edgevit.json, which Keras takes for assets (any
# member beyond its three): it unpacked the whole archive into TMPDIR on every
# load, and left the copy there when that disk was full. Files written so are
# still read.
METADATA_MEMBER = "metadata.json"
EDGEVIT_KEY = "edgevit"
EARLIER_EDGEVIT_MEMBER = "edgevit.json"
# What is read of a .keras archive before Keras opens it. A 4 MB file whose config.json inflated to 1.5 GB took
# 3.8 GB of memory to read, one with a 3 GiB weights member 7 GB (Keras's own guard starts at 4 GiB). Keras
# stores members uncompressed, and a model description is a few hundred KB (mobilevit_v3_xxs: 179 KB).
MAX_DESCRIPTION_BYTES = 64 << 20  # config.json and metadata.json
# Zip members that inflate beyond both of these are decompression bombs: Keras stores members uncompressed, and
# checkpoints (float tensors) hardly compress.
BOMB_FLOOR_BYTES, MAX_EXPANSION = 64 << 20, 100


def inflates_like_a_bomb(info: zipfile.ZipInfo) -> bool:
    return info.file_size > max(BOMB_FLOOR_BYTES, MAX_EXPANSION * info.compress_size)


def existing_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    problem = file_problem(path)
    if problem:
        raise EdgevitError(f"{what} {str(path)!r} {problem}.")
    return path


def class_names_of(model) -> list[str] | None:
    """The class names ``model`` was trained with (None: not known)."""
    names = getattr(model, "edgevit_class_names", None)
    return list(names) if names else None


def set_class_names(model, names) -> None:
    """Attach class names to ``model``: one per output (a detector's: per
    class of its scores, the last output), each on one line (they become
    the lines of the labels file)."""
    names = [str(name) for name in names]
    classes = int(model.outputs[-1].shape[-1])
    if len(names) != classes:
        raise EdgevitError(f"{len(names)} class names given for a model with {classes} outputs.")
    for name in names:
        problem = label_problem(name)
        if problem:
            raise EdgevitError(f"Class name {name!r} cannot be a label: {problem}.")
    model.edgevit_class_names = tuple(names)


def save_model(model, path: str | Path) -> Path:
    """Save ``model`` as ``.keras`` with its class names, through a staging
    folder beside ``path``: a failed or interrupted save never leaves half a
    model (:func:`edgevit.writing.staged`)."""
    path = Path(path)
    with staged([path]) as staging, staging.writing(path) as staged_path:
        model.save(staged_path)
        names = class_names_of(model)
        if names:
            _add_to_metadata(staged_path, {"class_names": names})
    return path


def _add_to_metadata(path: Path, entry: dict) -> None:
    """Copy the archive ``path`` with ``entry`` under EDGEVIT_KEY in its
    metadata.json (zip members cannot be rewritten in place), then replace it."""
    copy = path.with_name(path.name + ".copy")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(copy, "w") as target:
        for info in source.infolist():
            if info.filename == METADATA_MEMBER:
                target.writestr(info, json.dumps({**json.loads(source.read(info)), EDGEVIT_KEY: entry}))
                continue
            with source.open(info) as member, target.open(info, "w") as copied:
                shutil.copyfileobj(member, copied)
    os.replace(copy, path)


def stored_class_names(path: str | Path) -> list[str] | None:
    """The class names saved in a ``.keras`` file by :func:`save_model`."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            if EARLIER_EDGEVIT_MEMBER in members:
                entry = json.loads(_description(archive, EARLIER_EDGEVIT_MEMBER, path))
            elif METADATA_MEMBER in members:
                entry = json.loads(_description(archive, METADATA_MEMBER, path)).get(EDGEVIT_KEY) or {}
            else:
                return None
            names = entry.get("class_names")
    except (OSError, zipfile.BadZipFile, ValueError, AttributeError, RecursionError):
        raise EdgevitError(f"The edgevit entry in {str(path)!r} is damaged.") from None
    return [str(name) for name in names] if isinstance(names, list) else None


def spec_of(model) -> ModelSpec:
    """The registered spec a Keras model was built from (models carry their
    variant name as ``model.name``)."""
    try:
        return get_spec(model.name)
    except EdgevitError:
        raise EdgevitError(f"Model {model.name!r} is not an edgevit model "
                           "(its name matches no registered variant).") from None


def load_model(path: str | Path):
    """Load a ``.keras`` file written by edgevit (or by ``model.save``)."""
    import keras

    import edgevit.layers  # noqa: F401  (registers the custom layers)
    import edgevit.models  # noqa: F401
    import edgevit.quantize.conv_dense_layers  # noqa: F401  (registers the QAT layers)
    import edgevit.quantize.multi_op_layers  # noqa: F401
    import edgevit.quantize.quantizers  # noqa: F401

    path = check_model_file(path)
    try:
        model = keras.saving.load_model(path, compile=False)
    except OSError as err:
        if err.errno not in WRITE_FAILURES:
            raise EdgevitError(f"Could not load {str(path)!r}: {first_line(err)}") from err
        # Keras unpacks an archive with more than its three members (one an earlier edgevit wrote)
        raise EdgevitError(f"Could not load {str(path)!r}: Keras unpacks it into {tempfile.gettempdir()!r}, where "
                           f"writing failed: {cause(err)} (TMPDIR chooses another folder).") from None
    except Exception as err:
        raise EdgevitError(f"Could not load {str(path)!r}: {_load_failure(err)}") from err
    spec_of(model)
    names = stored_class_names(path)
    if names:
        set_class_names(model, names)
    return model


def _load_failure(err: Exception) -> str:
    """Why Keras could not load a model, in words a command-line user can act
    on: Keras's advice on Python code in a file (pass safe_mode=False) is for
    its own API, and edgevit never runs such code."""
    if "safe_mode" in str(err):
        return ("it holds Python code (such as a Lambda layer's function), which would run as it loads; edgevit "
                "never runs it (edgevit's layers hold none): rebuild the model without that layer.")
    return first_line(err)


def check_model_file(path: str | Path) -> Path:
    """A ``.keras`` file whose model description is readable JSON (junk in
    it made Keras fail with a text codec message); cheap, before TensorFlow
    loads."""
    model_description(path)
    return Path(path)


def model_description(path: str | Path) -> bytes:
    """The config.json of the ``.keras`` file ``path``, checked to be
    readable JSON, read without Keras (see :func:`check_model_file`)."""
    path = existing_file(path, "Model file")
    if path.suffix != MODEL_SUFFIX or not zipfile.is_zipfile(path):
        raise EdgevitError(f"{str(path)!r} is not a Keras model file (.keras).")
    try:
        with zipfile.ZipFile(path) as archive:
            _refuse_bombs(archive, path)
            config = _description(archive, "config.json", path)
        json.loads(config.decode("utf-8"))
    except KeyError:
        raise EdgevitError(f"{str(path)!r} is not a Keras model file: the archive has no config.json "
                           "(another kind of zip file?).") from None
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise EdgevitError(f"{str(path)!r} is damaged: its config.json (the model description) is not "
                           f"readable ({type(err).__name__}).") from None
    return config


def _refuse_bombs(archive: zipfile.ZipFile, path: Path) -> None:
    """Refuse an archive member that would inflate far beyond what is stored
    (a decompression bomb), by its declared sizes (zipfile never reads past a
    member's declared size)."""
    for info in archive.infolist():
        if inflates_like_a_bomb(info):
            raise EdgevitError(f"{str(path)!r} is not a model edgevit loads: its member {info.filename} would "
                               f"inflate from {info.compress_size:,} to {info.file_size:,} bytes (a decompression "
                               "bomb; Keras stores members uncompressed).")


def _description(archive: zipfile.ZipFile, member: str, path) -> bytes:
    """A JSON member of the .keras archive ``path``, refused beyond MAX_DESCRIPTION_BYTES."""
    size = archive.getinfo(member).file_size
    if size > MAX_DESCRIPTION_BYTES:
        raise EdgevitError(f"{str(path)!r} is not a model edgevit loads: its {member} is {size:,} bytes, beyond the "
                           f"{MAX_DESCRIPTION_BYTES:,} that a model description may take.")
    return archive.read(member)


def load_weights_into(model, path: str | Path) -> None:
    """Load a ``.weights.h5`` file, or the weights of a ``.keras`` file, into
    ``model``; architecture mismatches name the first tensor that differs."""
    path = existing_file(path, "Weights file")
    if path.suffix == MODEL_SUFFIX:
        source = load_model(path)
        copy_weights(source, model, str(path))
        return
    if not path.name.endswith(".weights.h5"):
        raise EdgevitError(f"{str(path)!r} is not a Keras weights file: expected NAME.weights.h5 "
                           "or NAME.keras (PyTorch checkpoints go through `edgevit import-weights`).")
    import h5py

    try:
        with h5py.File(path, "r"):
            pass
    except OSError as err:
        raise EdgevitError(f"Weights file {str(path)!r} is corrupt or not HDF5: {first_line(err)}") from err
    before = model.get_weights()
    try:
        # Keras only warns when some layers' weights do not fit and loads the rest.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(path)
        misfits = [str(w.message) for w in caught if "could not be loaded" in str(w.message)]
        if misfits:
            raise ValueError(misfits[0])
    except Exception as err:
        model.set_weights(before)
        raise EdgevitError(f"Weights in {str(path)!r} do not fit {model.name}: {_misfit(model, str(err))}") from err


# How Keras names a tensor that does not fit when it loads a weights file.
_KERAS_SHAPE_MISMATCH = re.compile(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))"
                                   r".*?Target variable: <Variable path=([^,]+),", re.S)


def _misfit(model, keras_message: str) -> str:
    """The first tensor that does not fit, with both shapes, from Keras'
    (multi-line, value-dumping) message."""
    found = _KERAS_SHAPE_MISMATCH.search(keras_message)
    if not found:
        return first_line(ValueError(keras_message))
    needed, given, variable = found.groups()
    return f"{variable} has shape {given} in the file, the model needs {needed}" + _head_hint(model, variable, given)


def _head_hint(model, variable_path: str, file_shape: str) -> str:
    """When only the classifier differs: the --num-classes that fits the file."""
    head = model.layers[-1].name
    dims = [int(d) for d in re.findall(r"\d+", file_shape)]
    if not variable_path.startswith(head + "/") or not dims:
        return "."
    return f" (the file holds a {dims[-1]}-class classifier: pass --num-classes {dims[-1]})."


def copy_weights(source, target, source_label: str) -> None:
    src, dst = source.weights, target.weights
    for s, d in zip(src, dst):
        if tuple(s.shape) != tuple(d.shape):
            raise EdgevitError(f"Weights in {source_label} do not fit {target.name}: {s.path} has shape "
                               f"{tuple(s.shape)} in the file, the model needs {tuple(d.shape)}"
                               + _head_hint(target, d.path, str(tuple(s.shape))))
    if len(src) != len(dst):
        raise EdgevitError(f"Weights in {source_label} do not fit {target.name}: "
                           f"{len(src)} tensors given, {len(dst)} expected.")
    target.set_weights(source.get_weights())


def resolve_model(name_or_path: str, num_classes: int | None = None, input_size: int | None = None,
                  weights: str | None = None):
    """A registered name or a ``.keras`` file -> (model, spec). A ``.keras``
    model is rebuilt when another input size is asked for."""
    if name_or_path.endswith(MODEL_SUFFIX) or Path(name_or_path).is_file():

        if is_imagenet(weights):
            raise EdgevitError(f"--weights imagenet starts a registered model (e.g. `edgevit list --pretrained`) "
                               f"from the ImageNet weights; {name_or_path} already holds its own weights.")
        model = load_model(name_or_path)
        spec = spec_of(model)
        if num_classes not in (None, model.outputs[-1].shape[-1]):
            raise EdgevitError(f"{name_or_path} has {model.outputs[-1].shape[-1]} classes; "
                               "--num-classes cannot change a trained model's head.")
        if weights is not None:
            load_weights_into(model, weights)
        if input_size not in (None, model.inputs[0].shape[1]):
            resized = create_model(spec.name, num_classes=model.outputs[-1].shape[-1], input_size=input_size)
            copy_weights(model, resized, name_or_path)
            if class_names_of(model):
                set_class_names(resized, class_names_of(model))
            model = resized
        return model, spec
    if weights is None:  # random weights, seeded: the same command writes the same file
        import keras

        keras.utils.set_random_seed(0)
    model = create_model(name_or_path, num_classes=num_classes, input_size=input_size, weights=weights)
    names = stored_class_names(weights) if weights is not None and weights.endswith(MODEL_SUFFIX) else None
    if names and len(names) == int(model.outputs[-1].shape[-1]):
        set_class_names(model, names)
    return model, get_spec(name_or_path)

