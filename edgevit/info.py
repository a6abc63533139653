"""Facts about a registered model: parameters, MACs, input size, preprocessing.

Without an input size they come from the registry's catalog (no model
built, no TensorFlow imported; the catalog has no MACs for the largest
variants); at a given size the model is built and counted. ``python -m
edgevit.info [NAME ... | --all]`` rewrites the catalog from the family
modules and counts new variants and the named ones (``--all``: every
variant, one process each, most of an hour on two cores).
"""
from __future__ import annotations

import json
import subprocess
import sys

from edgevit.registry import catalog_entry, create_model, declared_specs, get_spec, read_catalog, write_catalog

# Counting MACs converts the model to fp32, which takes about this much
# memory per parameter (cswin_large, 173 M parameters: 12.8 GB at its peak).
CONVERSION_BYTES_PER_PARAMETER = 75
# The catalog leaves the MACs of larger variants to `edgevit info
# --input-size`, so that it can be written on a 16 GB machine.
MACS_RECORDED_UP_TO_PARAMETERS = 180_000_000


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


def counts(name: str, input_size: int, macs_up_to_parameters: int | None = None) -> tuple[int, int | None]:
    """(parameters, MACs) of ``name`` built at ``input_size``; MACs None
    above ``macs_up_to_parameters``."""
    model = create_model(name, input_size=input_size)
    parameters = count_params(model)
    if macs_up_to_parameters is not None and parameters > macs_up_to_parameters:
        return parameters, None
    return parameters, count_macs(model)


def model_info(name: str, input_size: int | None = None) -> dict:
    """The variant's facts; ``macs`` None where the catalog has none and no
    ``input_size`` asked for the model to be counted."""
    spec = get_spec(name)
    size = input_size or spec.default_input_size
    parameters, macs = (spec.parameters, spec.macs) if input_size is None else counts(name, size)
    return {
        "name": spec.name,
        "family": spec.family,
        "task": spec.task,
        "num_classes": spec.num_classes,
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
    variant, its counts kept unless it is new or named in ``recount``."""
    declared = declared_specs()
    unknown = sorted(set(recount) - set(declared))
    if unknown:
        raise SystemExit(f"error: no variant named {', '.join(unknown)}")
    old = read_catalog()
    entries = {}
    for name, spec in sorted(declared.items()):
        entry = catalog_entry(spec)
        kept = name in old and name not in recount
        entry["parameters"], entry["macs"] = (old[name]["parameters"], old[name]["macs"]) if kept else (None, None)
        entries[name] = entry
    # the declarations first: a child counts a variant by building it, which
    # finds it by name in the catalog (a new one too)
    write_catalog(entries)
    for name, entry in entries.items():
        if name in old and name not in recount:
            continue
        entry["parameters"], entry["macs"] = _counted_in_a_child(name, declared[name].default_input_size)
        macs = "MACs not counted" if entry["macs"] is None else f"{entry['macs']:,} MACs"
        print(f"{name}: {entry['parameters']:,} parameters, {macs}", file=sys.stderr)
    write_catalog(entries)


def _counted_in_a_child(name: str, input_size: int) -> tuple[int, int | None]:
    """:func:`counts` in a process of its own: TensorFlow keeps much of a
    conversion's memory until the process ends."""
    code = ("import json, sys; from edgevit.info import counts\n"
            f"print(json.dumps(counts({name!r}, {input_size}, {MACS_RECORDED_UP_TO_PARAMETERS})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    parameters, macs = json.loads(proc.stdout.splitlines()[-1])
    return parameters, macs


if __name__ == "__main__":
    refresh_catalog(sorted(declared_specs()) if sys.argv[1:] == ["--all"] else sys.argv[1:])
