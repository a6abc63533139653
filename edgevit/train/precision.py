"""Mixed precision for float fine-tuning (`edgevit finetune --mixed-precision`).

The model trained computes in float16 and keeps float32 weights (Keras's
``mixed_float16`` policy); the loss is scaled (``LossScaleOptimizer``, see
:class:`edgevit.train.loop.Trainer`) so that small gradients survive
float16. It is a copy of the float32 model: the command copies the trained
weights back into the float32 model and saves that one, so the saved model,
its conversion and QAT compute in float32 as always. QAT itself never runs
in float16: its ranges and integer arithmetic are exact float32 arithmetic.
"""
from __future__ import annotations

from contextlib import contextmanager

MIXED_POLICY = "mixed_float16"


@contextmanager
def dtype_policy(name: str):
    """Layers made in the block compute with Keras dtype policy ``name``."""
    import keras

    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def mixed_precision_copy(model):
    """``model`` rebuilt to compute in float16 (float32 weights, the same values)."""
    import keras

    def remade(layer):
        config = {key: value for key, value in layer.get_config().items() if key != "dtype"}
        return type(layer).from_config(config)

    with dtype_policy(MIXED_POLICY):
        copy = keras.models.clone_model(model, clone_function=remade)
    copy.set_weights(model.get_weights())
    return copy
