"""``import_weights``: read a checkpoint, find its naming, fill the model, save."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgevit.errors import EdgevitError
from edgevit.saving import MODEL_SUFFIX

from .checkpoints import WEIGHTS_SUFFIX, Checkpoint, load_checkpoint, save_weights_atomic
from .registry import IMPORTERS, Importer
from .rules import Target, assign, match_score, plan, take_rgb

# Every Importer.source; `edgevit import-weights --source` offers these (and auto).
SOURCES = ("timm", "cvnets", "huggingface", "official")


def _load_importers():
    from . import cvnets, hf_cvt, timm  # noqa: F401  (registering)
    from . import cswin, hf_mobilevit  # noqa: F401
    from . import t2t  # noqa: F401


def importers_for(family: str) -> dict[str, Importer]:
    """Checkpoint sources with an importer for a model family."""
    _load_importers()
    return {src: imp for (src, fam), imp in IMPORTERS.items() if fam == family}


def sources_for(model_name: str) -> list[str]:
    from edgevit.registry import get_spec

    return sorted(importers_for(get_spec(model_name).family))


CHANNEL_ORDERS = ("RGB", "BGR")


def targets_for(model, importer: Importer, channel_order: str | None = None) -> list[Target]:
    """Where each weight of ``model`` comes from in ``importer``'s naming;
    a checkpoint trained on BGR (``channel_order``, default: what the
    source's official checkpoints were trained on) is read so that the model
    takes RGB. ``export_state_dict`` of these targets writes a checkpoint in
    the source's own convention."""
    targets = plan(model, importer.rules(model), importer.source)
    if (channel_order or importer.channel_order(model)) == "BGR":
        take_rgb(targets, model)
    return targets


@dataclass
class ImportResult:
    model: object           # the Keras model holding the imported weights
    report: dict


def _build(spec, num_classes, input_size, options=None):
    from edgevit.registry import create_model

    return create_model(spec.name, num_classes=num_classes, input_size=input_size, **(options or {}))


def _head_classes(importer, model, rules, ckpt) -> int | None:
    """Classes of the checkpoint's classifier (the first head layer)."""
    targets = plan(model, rules, importer.source)
    for t in targets:
        layer_path, _, name = t.path.rpartition("/")
        if layer_path in importer.head and name in ("bias", "kernel"):
            value = ckpt.tensors.get(t.key)
            if value is not None and value.ndim >= 1:
                return importer.head_classes(value)
    return None


def import_weights(checkpoint: str | Path, model: str, output: str | Path | None = None, *,
                   source: str = "auto", num_classes: int | None = None,
                   input_size: int | None = None, channel_order: str | None = None) -> ImportResult:
    """Import ``checkpoint`` into the edgevit variant ``model``.

    ``source`` is ``timm``, ``cvnets``, ``huggingface`` or ``official`` (``auto`` picks
    the naming the checkpoint uses). ``num_classes`` defaults to the checkpoint's
    classifier; ``input_size`` defaults to the variant's, and position
    embeddings are resampled when it differs from the checkpoint's.
    ``channel_order`` is what the checkpoint was trained on ("RGB" or "BGR";
    default: what the source's official checkpoints of the model were
    trained on): a BGR checkpoint's stem is turned to take RGB, as every
    edgevit model does. The weights are written to ``output`` (a
    ``.weights.h5`` file) when given.
    """
    from edgevit.registry import get_spec

    spec = get_spec(model)
    available = importers_for(spec.family)
    if not available:
        raise EdgevitError(f"No checkpoint importer for {spec.family} models yet.")
    if source != "auto" and source not in available:
        raise EdgevitError(f"{model} imports {', '.join(sorted(available))} checkpoints, not {source!r}.")
    if channel_order not in (None, *CHANNEL_ORDERS):
        raise EdgevitError(f"Channel order {channel_order!r} is none of {', '.join(CHANNEL_ORDERS)}.")
    if output is not None and not str(output).endswith((WEIGHTS_SUFFIX, MODEL_SUFFIX)):
        raise EdgevitError(f"Output {str(output)!r} must end in {WEIGHTS_SUFFIX} (a Keras weights file) or "
                           f"{MODEL_SUFFIX} (a Keras model).")
    ckpt = load_checkpoint(checkpoint)

    probe = _build(spec, num_classes or spec.num_classes, input_size)
    candidates = [available[source]] if source != "auto" else list(available.values())
    scored = []
    for imp in candidates:
        rules = imp.rules(probe)
        view = Checkpoint(ckpt.path, imp.merged(ckpt.tensors), ckpt.entry)
        scored.append((match_score(plan(probe, rules, imp.source), view), imp, view))
    scored.sort(key=lambda s: -s[0])
    score, importer, ckpt = scored[0]
    if score < 0.5:
        tried = " or ".join(imp.source for _, imp, _ in scored)
        expected = [t.key for t in plan(probe, importer.rules(probe), importer.source)]
        absent = next(key for key in expected if key not in ckpt.tensors)
        foreign = next((key for key in ckpt.tensors if key not in set(expected)), None)
        raise EdgevitError(f"{ckpt.path!r} does not look like a {tried} checkpoint of {model}: it holds "
                           f"{score:.0%} of the {len(set(expected))} tensor names {importer.source} gives "
                           f"{model} (it lacks {absent!r}, for one"
                           + (f"; {foreign!r} is one of its names that {model} does not use" if foreign else "")
                           + ").")
    rules = importer.rules(probe)
    classes = num_classes or _head_classes(importer, probe, rules, ckpt) or spec.num_classes
    if importer.options and output is not None and not str(output).endswith(MODEL_SUFFIX):
        options = ", ".join(f"{k}={v}" for k, v in importer.options.items())
        raise EdgevitError(f"{importer.source} checkpoints of {model} were trained with {options}, which a weights "
                           f"file does not record (a model built from it would compute otherwise): write a model "
                           f"file, e.g. -o {model}{MODEL_SUFFIX}, and convert that file.")
    same = classes == (num_classes or spec.num_classes) and not importer.options
    keras_model = probe if same else _build(spec, classes, input_size, importer.options)
    order = channel_order or importer.channel_order(keras_model)
    stats = assign(keras_model, targets_for(keras_model, importer, order), ckpt, importer.source)
    report = {
        "checkpoint": str(checkpoint),
        "entry": ckpt.entry,
        "model": spec.name,
        "source": importer.source,
        "reference": importer.reference,
        "tensors": stats["tensors"],
        "ignored": stats["ignored"],
        "num_classes": classes,
        "input_size": int(keras_model.inputs[0].shape[1]),
        "resampled": stats.get("resampled", []),
        "channel_order": order if order == "RGB" else f"{order} (stem input channels reversed: the model takes RGB)",
        "options": dict(importer.options),
        "output": None,
    }
    if output is not None and str(output).endswith(MODEL_SUFFIX):
        from edgevit.saving import save_model

        report["output"] = str(save_model(keras_model, output))
    elif output is not None:
        report["output"] = str(save_weights_atomic(keras_model, output))
    return ImportResult(keras_model, report)
