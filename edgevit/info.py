"""Facts about a registered model: parameters, MACs, input size, preprocessing."""
from __future__ import annotations

from edgevit.registry import create_model, get_spec


def count_params(model) -> int:
    """Trainable parameters (Keras also stores BatchNorm moving statistics,
    which PyTorch counts as buffers, so those are left out)."""
    return int(sum(w.numpy().size for w in model.trainable_weights))


def count_macs(model) -> int:
    """Multiply-accumulates of one batch-1 forward pass, from the layers that
    do the arithmetic (convolutions, dense layers, attention matmuls)."""
    total = 0
    for layer in _walk(model):
        macs = getattr(layer, "macs", None)
        if callable(macs):
            total += int(macs())
        else:
            total += _builtin_layer_macs(layer)
    return total


def _walk(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers and not getattr(layer, "macs", None):
            yield from _walk(layer)
        else:
            yield layer


def _builtin_layer_macs(layer) -> int:
    import keras

    if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)):
        out = layer.output.shape
        kh, kw = layer.kernel_size
        cin = layer.input.shape[-1]
        per_out = kh * kw * (1 if isinstance(layer, keras.layers.DepthwiseConv2D) else cin // layer.groups)
        return int(out[1] * out[2] * out[3] * per_out)
    if isinstance(layer, keras.layers.Dense):
        out = layer.output.shape
        tokens = 1
        for d in out[1:-1]:
            tokens *= d
        return int(tokens * layer.kernel.shape[0] * layer.kernel.shape[1])
    return 0


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
        "preprocessing": spec.preprocessing_at(size).to_dict(),
    }
