"""Model registry: one decorator registers a variant with its deployment facts.

Each family module defines one builder function per variant and decorates it
with ``@register_model(...)``. The registry records what an app needs to feed
the model correctly (input size and preprocessing as the official
implementation evaluates it) so that it can travel with exported files.

Reading the registry must not wait for TensorFlow, which every family module
imports: ``edgevit list`` and ``edgevit info`` answer from the catalog
(``edgevit/data/models.json``), the declarations of every variant with its
parameters and MACs at its default input size, written from the family
modules by ``python -m edgevit.info`` (tests/test_registry.py fails when the
two differ). A spec's builder imports the families when a model is built.
"""
from __future__ import annotations

import difflib
import fnmatch
import functools
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgevit.errors import EdgevitError


@dataclass(frozen=True)
class Preprocessing:
    """How an RGB image becomes the model input.

    The image is resized so its shorter side is ``resize_size`` (with
    ``interpolation``), center-cropped to ``input_size``, scaled to [0, 1],
    then normalized with ``(x - mean) / std``.
    """

    input_size: int
    resize_size: int
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def at_size(self, input_size: int) -> Preprocessing:
        """The same recipe for another input size (keeps the crop ratio)."""
        ratio = self.resize_size / self.input_size
        return Preprocessing(input_size, round(input_size * ratio), self.interpolation, self.mean, self.std)

    @property
    def value_range(self) -> tuple[float, float]:
        """Range of model-input values for pixel values in [0, 1]."""
        lo = min((0.0 - m) / s for m, s in zip(self.mean, self.std))
        hi = max((1.0 - m) / s for m, s in zip(self.mean, self.std))
        return (lo, hi)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        d["value_range"] = list(self.value_range)
        return d


# What --weights names for a model's official ImageNet weights.
IMAGENET = "imagenet"


def is_imagenet(weights) -> bool:
    return isinstance(weights, str) and weights.lower() == IMAGENET


TOP1, VOC_MIOU = "top-1", "VOC mIoU"
COCO_MAP = "COCO mAP"  # COCO val2017 box mAP@[0.5:0.95], as the detectors' publishers report it


@dataclass(frozen=True)
class Pretrained:
    """Where a variant's official ImageNet weights live (``weights="imagenet"``).

    ``location`` is a Hugging Face Hub repository (``source="hub"``, read
    with huggingface_hub) or a URL (``source="url"``, read with
    ``keras.utils.get_file``); ``file`` is the checkpoint in the repository,
    or the member of the downloaded archive (empty: the URL is the
    checkpoint). ``naming`` is the importer that reads it (``timm``,
    ``cvnets``, ``huggingface``). ``top1`` is the ImageNet-1k top-1 the
    publisher reports for this file, measured with the variant's registered
    preprocessing (a segmenter's: the PASCAL VOC 2012 val mIoU, as
    ``metric`` says; a detector's: the COCO mAP). ``channel_order`` is what the checkpoint was trained on:
    a "BGR" one gets its stem convolution's input channels reversed at
    import, so every edgevit model takes RGB. ``sha256`` pins the file; Hub
    files without it are checked against the Hub's own LFS sha256.
    """

    tag: str
    source: str
    location: str
    file: str
    naming: str
    top1: float
    licence: str
    channel_order: str = "RGB"
    sha256: str | None = None
    metric: str = TOP1

    @property
    def where(self) -> str:
        """The checkpoint as a user would look it up."""
        if self.source == "hub":
            return f"https://huggingface.co/{self.location} ({self.file})"
        return self.location + (f" ({self.file})" if self.file else "")

    def to_dict(self) -> dict:
        d = {"tag": self.tag, "source": self.where, "naming": self.naming, "top1": self.top1,
             "licence": self.licence, "checkpoint_channel_order": self.channel_order, "sha256": self.sha256}
        # the ``top1`` key holds a segmenter's mIoU: ``metric`` says so
        return d if self.metric == TOP1 else {**d, "metric": self.metric}


@dataclass(frozen=True)
class Unpublished:
    """A variant whose official ImageNet weights cannot be fetched: ``reason``
    says where they live, if anywhere."""

    reason: str

    def to_dict(self) -> dict:
        return {"unavailable": self.reason}


def timm_weights(tag: str, top1: float, licence: str, *, file: str = "model.safetensors") -> Pretrained:
    """timm's copy on the Hub, ``timm/<tag>`` (timm's own ImageNet top-1 for it)."""
    return Pretrained(tag, "hub", f"timm/{tag}", file, "timm", top1, licence)


def hub_weights(repo: str, file: str, top1: float, licence: str, *, naming: str, channel_order: str = "RGB",
                metric: str = TOP1) -> Pretrained:
    """A Hub repository that is not timm's (e.g. ``microsoft/cvt-13``)."""
    return Pretrained(repo, "hub", repo, file, naming, top1, licence, channel_order, metric=metric)


def url_weights(url: str, member: str, top1: float, licence: str, *, tag: str, naming: str,
                channel_order: str = "RGB", sha256: str | None = None, metric: str = TOP1) -> Pretrained:
    """A plain URL: the checkpoint itself, or an archive holding ``member``."""
    return Pretrained(tag, "url", url, member, naming, top1, licence, channel_order, sha256, metric)


PretrainedTable = Mapping[str, "Pretrained | Unpublished"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    builder: Callable = field(repr=False)
    default_input_size: int
    preprocessing: Preprocessing
    input_size_multiple: int = 32
    reference: str = ""
    checkpoint_formats: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    pretrained: Pretrained | Unpublished | None = None
    # Layers whose ops --int8-mixed also keeps in float: where int8 loses the
    # model's accuracy (docs/families.md measures each).
    mixed_float_layers: tuple[str, ...] = ()
    # Trainable parameters and multiply-accumulates at default_input_size, as
    # the catalog records them (None for a spec from elsewhere; MACs None for
    # the largest variants, see edgevit.info).
    parameters: int | None = None
    macs: int | None = None
    # What the model's output is: "classification" (logits [B, classes]) or
    # "segmentation" (logits [B, H / stride, W / stride, classes], NHWC) or
    # "detection" (box regressions [B, anchors, 4] and logits [B, anchors, classes]).
    task: str = "classification"
    # Classes of a model built without ``num_classes``, and of its official weights.
    num_classes: int = 1000

    def preprocessing_at(self, input_size: int | None) -> Preprocessing:
        if input_size is None or input_size == self.preprocessing.input_size:
            return self.preprocessing
        return self.preprocessing.at_size(input_size)


CATALOG = Path(__file__).with_name("data") / "models.json"
# what a model does: a classifier outputs [1, classes], a segmenter logits [1, h, w, classes] at its output
# stride, a detector boxes and scores (a file's metadata without a task is a classifier's)
TASKS = CLASSIFICATION, SEGMENTATION, DETECTION = ("classification", "segmentation", "detection")

# Every variant as the catalog describes it, read on first use.
_REGISTRY: dict[str, ModelSpec] = {}
# Every variant as its family module declares it (with its builder), filled
# when the families are imported.
_DECLARED: dict[str, ModelSpec] = {}


def builder_options(family_builder: Callable) -> tuple[str, ...]:
    """The keyword-only arguments of a family builder (drop rates): what its
    registered variants pass on from ``create_model(name, **options)``."""
    return tuple(p.name for p in inspect.signature(family_builder).parameters.values()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY)


def register_model(*, family: str, default_input_size: int, preprocessing: Preprocessing,
                   input_size_multiple: int = 32, reference: str = "",
                   checkpoint_formats: tuple[str, ...] = (), options: tuple[str, ...] = (),
                   pretrained: PretrainedTable | None = None, mixed_float_layers: tuple[str, ...] = (),
                   task: str = "classification", num_classes: int = 1000):
    """Register the decorated builder ``fn(num_classes, input_size, **options)
    -> keras.Model`` under its function name; ``options`` names the keyword
    arguments it accepts (see :func:`builder_options`). ``pretrained`` is the
    family's table of official ImageNet weights by variant name (one line
    per variant, as timm's ``default_cfgs``), read by ``weights="imagenet"``;
    ``mixed_float_layers`` the layer names whose ops int8_mixed keeps in float;
    ``task`` one of ``TASKS``; ``num_classes`` the classes of the official
    weights (the builder's default)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")

    def decorator(fn):
        name = fn.__name__
        if name in _DECLARED:
            raise ValueError(f"model {name!r} registered twice")
        _DECLARED[name] = ModelSpec(
            name=name, family=family, builder=fn, default_input_size=default_input_size,
            preprocessing=preprocessing, input_size_multiple=input_size_multiple,
            reference=reference, checkpoint_formats=checkpoint_formats, options=tuple(options),
            pretrained=(pretrained or {}).get(name), mixed_float_layers=tuple(mixed_float_layers), task=task,
            num_classes=num_classes)
        return fn

    return decorator


def declared_specs() -> dict[str, ModelSpec]:
    """Every variant as the family modules declare it (imports them, and
    with them TensorFlow): what the catalog is written from."""
    import edgevit.models  # noqa: F401  (importing registers every family)

    return dict(_DECLARED)


def _build_declared(name: str, **kwargs):
    return declared_specs()[name].builder(**kwargs)


# --- the catalog -------------------------------------------------------------------------------------

def catalog_entry(spec: ModelSpec) -> dict:
    """What the catalog records of a variant besides its counts (JSON)."""
    entry = {"family": spec.family, "default_input_size": spec.default_input_size,
             "input_size_multiple": spec.input_size_multiple, "preprocessing": asdict(spec.preprocessing),
             "reference": spec.reference, "checkpoint_formats": list(spec.checkpoint_formats),
             "options": list(spec.options), "mixed_float_layers": list(spec.mixed_float_layers)}
    # ImageNet classifiers' entries say nothing of either, as before segmenters existed
    if spec.task != "classification":
        entry["task"] = spec.task
    if spec.num_classes != 1000:
        entry["num_classes"] = spec.num_classes
    if isinstance(spec.pretrained, Pretrained):
        entry["pretrained"] = asdict(spec.pretrained)
        if spec.pretrained.metric == TOP1:  # the classifiers' lines as before segmenters
            del entry["pretrained"]["metric"]
    elif isinstance(spec.pretrained, Unpublished):
        entry["unpublished"] = spec.pretrained.reason
    return json.loads(json.dumps(entry))  # tuples as lists, as the file holds them


def _spec_of_entry(name: str, entry: dict) -> ModelSpec:
    pre = entry["preprocessing"]
    preprocessing = Preprocessing(pre["input_size"], pre["resize_size"], pre["interpolation"],
                                  tuple(pre["mean"]), tuple(pre["std"]))
    pretrained = Pretrained(**entry["pretrained"]) if "pretrained" in entry else \
        Unpublished(entry["unpublished"]) if "unpublished" in entry else None
    return ModelSpec(name=name, family=entry["family"], builder=functools.partial(_build_declared, name),
                     default_input_size=entry["default_input_size"], preprocessing=preprocessing,
                     input_size_multiple=entry["input_size_multiple"], reference=entry["reference"],
                     checkpoint_formats=tuple(entry["checkpoint_formats"]), options=tuple(entry["options"]),
                     pretrained=pretrained, mixed_float_layers=tuple(entry["mixed_float_layers"]),
                     parameters=entry["parameters"], macs=entry["macs"],
                     task=entry.get("task", "classification"), num_classes=entry.get("num_classes", 1000))


def read_catalog(path: Path = CATALOG) -> dict[str, dict]:
    """The catalog's entries by variant name."""
    return json.loads(path.read_text(encoding="utf-8"))["models"]


def write_catalog(entries: Mapping[str, dict], path: Path = CATALOG) -> None:
    """One variant a line, so that a change reads as a one-line diff."""
    about = ("Every registered variant, written from edgevit/models/ by `python -m edgevit.info`; parameters "
             "and MACs at the default input size (MACs null above edgevit.info.MACS_RECORDED_UP_TO_PARAMETERS).")
    lines = [f"  {json.dumps(name)}: {json.dumps(entries[name])}" for name in sorted(entries)]
    path.write_text(f'{{"about": {json.dumps(about)},\n "models": {{\n' + ",\n".join(lines) + "\n}}\n",
                    encoding="utf-8")


def _registry() -> dict[str, ModelSpec]:
    if not _REGISTRY:
        _REGISTRY.update({name: _spec_of_entry(name, entry) for name, entry in read_catalog().items()})
    return _REGISTRY


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted, optionally filtered by a shell-style pattern."""
    names = sorted(_registry())
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return names


def get_spec(name: str) -> ModelSpec:
    registry = _registry()
    try:
        return registry[name]
    except KeyError:
        by_lower = {known.lower(): known for known in registry}  # names are lower case: MOBILEVIT_V3_XXS got no hint
        close = [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.5)]
        hint = f" Did you mean: {', '.join(close)}?" if close else " Run `edgevit list` to see all models."
        raise EdgevitError(f"Unknown model {name!r}.{hint}") from None


def check_input_size(spec: ModelSpec, input_size: int) -> None:
    multiple = spec.input_size_multiple
    if input_size <= 0 or input_size % multiple:
        lo = max(multiple, input_size // multiple * multiple)
        raise EdgevitError(
            f"Input size {input_size} does not work for {spec.name}: it must be a positive "
            f"multiple of {multiple} (its patch grid), e.g. {lo} or {lo + multiple}.")


# Builder options that switch arithmetic a checkpoint was trained with
# (deeplabv3's ``dilate_blocks``); the others change training only.
SWITCHES = ("dilate_blocks",)


def check_options(spec: ModelSpec, options: dict) -> None:
    unknown = [key for key in options if key not in spec.options]
    if unknown:
        takes = f"it takes {', '.join(spec.options)}" if spec.options else "it takes no builder arguments"
        raise EdgevitError(f"{spec.name} has no argument {', '.join(unknown)}: {takes} "
                           "(besides num_classes, input_size and weights).")
    # Every builder option but the switches is a drop probability; an option
    # of another kind needs its own rule here.
    for key, value in options.items():
        if key in SWITCHES:
            if not isinstance(value, bool):
                raise EdgevitError(f"{spec.name}: {key} must be True or False, got {value!r}.")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise EdgevitError(f"{spec.name}: {key} must be a probability in [0, 1), got {value!r}.")


def create_model(name: str, num_classes: int | None = None, input_size: int | None = None,
                 weights: str | None = None, **options):
    """Build a registered model as a Keras functional model with a static
    ``input_size x input_size x 3`` input and ``num_classes`` classes (by
    default the variant's: 1000 ImageNet classes for the classifiers, 21
    PASCAL VOC classes for the segmenters).

    ``weights`` is a Keras weights file (``.weights.h5``), a ``.keras`` file
    of the same architecture, or ``"imagenet"``: the official ImageNet
    weights (downloaded, verified and cached by :mod:`edgevit.pretrained`;
    with another ``num_classes``, every weight but the classifier's).
    ``options`` go to the family builder, as timm's
    ``create_model`` passes its keyword arguments on: ``drop_path_rate``
    (stochastic depth) for the ViT-style and MLP families, ``dropout``,
    ``attn_dropout``, ``ffn_dropout`` and ``classifier_dropout`` for MobileViT;
    ``get_spec(name).options`` lists what a model takes. They change training
    only: parameters and inference outputs stay the same; ``SWITCHES`` aside
    (DeepLabV3's ``dilate_blocks``: the arithmetic an official checkpoint was
    trained with, which ``weights="imagenet"`` sets itself).
    """
    spec = get_spec(name)
    input_size = spec.default_input_size if input_size is None else int(input_size)
    num_classes = spec.num_classes if num_classes is None else num_classes
    check_input_size(spec, input_size)
    if num_classes < 1:
        raise EdgevitError(f"--num-classes must be at least 1, got {num_classes}.")
    check_options(spec, options)
    from edgevit.native_output import import_tensorflow_quietly
    from edgevit.pretrained import cached_weights, is_imagenet, load_imagenet, trained_with

    import_tensorflow_quietly()  # its start-up chatter (CUDA probes, CPU features) hidden, as the CLI hides it

    # the weights first: a model without official weights, a missing torch or no network fail before a build
    imagenet = cached_weights(spec, input_size) if is_imagenet(weights) else None
    source = None
    if imagenet is not None:
        options = {**options, **trained_with(spec)}
    elif weights is not None and str(weights).endswith(".keras"):
        # a model file computes with the switches its layers were built with; built without them, its weights
        # would load and compute otherwise
        from edgevit.models.deeplabv3 import switches_of
        from edgevit.saving import existing_file, load_model

        source = load_model(existing_file(weights, "Weights file"))
        options = {**options, **_switches_from(weights, switches_of(source), spec, options)}
    model = spec.builder(num_classes=num_classes, input_size=input_size, **options)
    if imagenet is not None:
        load_imagenet(model, spec, imagenet)
    elif source is not None:
        from edgevit.saving import copy_weights

        copy_weights(source, model, str(weights))
    elif weights is not None:
        from edgevit.saving import load_weights_into

        load_weights_into(model, weights)
    return model


def _switches_from(path, switches: dict, spec: ModelSpec, options: dict) -> dict:
    """The SWITCHES a model file computes with that ``spec`` takes, refused
    when an option asks otherwise (a file of another model: its weights do not fit)."""
    for key in SWITCHES:
        if key in options and bool(options[key]) != switches.get(key, False):
            raise EdgevitError(f"{path} computes with {key}={switches.get(key, False)}; it cannot be built with "
                               f"{key}={options[key]}.")
    return {key: value for key, value in switches.items() if key in spec.options}


def rebuild(model, num_classes: int, input_size: int):
    """``model``'s variant built again for another class count or input size,
    computing as ``model`` does: with the SWITCHES it was built with, read
    back from its layers (a ``.keras`` file keeps them in its layers' configs)."""
    from edgevit.models.deeplabv3 import switches_of

    return create_model(model.name, num_classes=num_classes, input_size=input_size, **switches_of(model))


def create_features(name: str, input_size: int | None = None, output_stride: int = 32, weights: str | None = None):
    """The feature maps of a MobileViT backbone (timm's ``features_only``):
    a Keras model whose outputs are layers 3, 4 and 5 at strides 8, 16 and 32,
    capped at ``output_stride`` (16 or 8 dilate the later layers instead);
    ``weights`` are the classifier's. ``edgevit.models.features.feature_info``
    gives each output's stride and channels."""
    from edgevit.models.features import create_features as create

    return create(name, input_size=input_size, output_stride=output_stride, weights=weights)
