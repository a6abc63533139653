"""Facts about a registered model: parameters, MACs, input size, preprocessing."""
from __future__ import annotations

from edgevit.registry import create_model, get_spec


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


def model_info(name: str, input_size: int | None = None) -> dict:
    spec = get_spec(name)
    size = input_size or spec.default_input_size
    model = create_model(name, input_size=size)
    return {
        "name": spec.name,
        "family": spec.family,
        "parameters": count_params(model),
        "macs": count_macs(model),
        "input_size": size,
        "default_input_size": spec.default_input_size,
        "input_size_multiple": spec.input_size_multiple,
        "reference": spec.reference,
        "checkpoint_formats": list(spec.checkpoint_formats),
        "int8_mixed_float_layers": list(spec.mixed_float_layers),
        "preprocessing": spec.preprocessing_at(size).to_dict(),
        "pretrained": spec.pretrained.to_dict() if spec.pretrained else {"unavailable": "none registered"},
    }
