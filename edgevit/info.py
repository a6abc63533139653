"""Facts about a registered model: parameters, MACs, input size, preprocessing.

At a variant's default input size they come from the registry's catalog
(no model built, no TensorFlow imported); at another size the model is
built and counted. ``python -m edgevit.info [NAME ...]`` rewrites the
catalog from the family modules, counting the named variants again (all of
them when none is named and for new variants; a full recount builds and
converts every variant: most of an hour on two cores).
"""
from __future__ import annotations

import sys

from edgevit.registry import catalog_entry, create_model, declared_specs, get_spec, read_catalog, write_catalog


def count_params(model) -> int:
    """Trainable parameters (Keras also stores BatchNorm moving statistics,
    which PyTorch counts as buffers, so those are left out)."""
    return int(sum(w.numpy().size for w in model.trainable_weights))


def count_macs(model) -> int:
    """Multiply-accumulates of one batch-1 forward pass, counted on the fp32
    TFLite graph (convolutions, dense layers and activation matmuls), i.e.
    on what the runtime executes."""
    from edgevit.export.convert import convert
    from edgevit.export.graph import describe

    return describe(convert(model, "fp32")).macs


def counts(name: str, input_size: int) -> tuple[int, int]:
    """(parameters, MACs) of ``name`` built at ``input_size``."""
    import keras

    model = create_model(name, input_size=input_size)
    try:
        return count_params(model), count_macs(model)
    finally:
        keras.backend.clear_session()  # a full recount builds every variant in one process


def model_info(name: str, input_size: int | None = None) -> dict:
    spec = get_spec(name)
    size = input_size or spec.default_input_size
    if size == spec.default_input_size and spec.parameters is not None:
        parameters, macs = spec.parameters, spec.macs
    else:
        parameters, macs = counts(name, size)
    return {
        "name": spec.name,
        "family": spec.family,
        "parameters": parameters,
        "macs": macs,
        "input_size": size,
        "default_input_size": spec.default_input_size,
        "input_size_multiple": spec.input_size_multiple,
        "reference": spec.reference,
        "checkpoint_formats": list(spec.checkpoint_formats),
        "int8_mixed_float_layers": list(spec.mixed_float_layers),
        "preprocessing": spec.preprocessing_at(size).to_dict(),
        "pretrained": spec.pretrained.to_dict() if spec.pretrained else {"unavailable": "none registered"},
    }


def refresh_catalog(recount: list[str]) -> None:
    """Rewrite the catalog from the family modules: the declarations of every
    variant, its counts kept unless it is new or named in ``recount`` (every
    variant when ``recount`` is empty)."""
    declared = declared_specs()
    unknown = sorted(set(recount) - set(declared))
    if unknown:
        raise SystemExit(f"error: no variant named {', '.join(unknown)}")
    old = read_catalog()
    entries = {}
    for name, spec in sorted(declared.items()):
        entry = catalog_entry(spec)
        if name in old and recount and name not in recount:
            entry["parameters"], entry["macs"] = old[name]["parameters"], old[name]["macs"]
        else:
            entry["parameters"], entry["macs"] = counts(name, spec.default_input_size)
            print(f"{name}: {entry['parameters']:,} parameters, {entry['macs']:,} MACs", file=sys.stderr)
        entries[name] = entry
    write_catalog(entries)


if __name__ == "__main__":
    refresh_catalog(sys.argv[1:])
