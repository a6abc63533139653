"""Fine-tuning and quantization-aware training on image folders.

- ``run``: a training run, from a command's arguments to the saved model
  (``Finetune``, ``QuantizationAwareTraining``);
- ``loop``: the Trainer (steps on every replica, epochs, resume);
- ``checkpoints``: per-epoch checkpoints (named, written, read) and the lock
  of their folder;
- ``distribute``: the tf.distribute strategy, the chief, broadcasts from it,
  synchronised BatchNorm, the worker watchdog;
- ``prepare``: building the model and the image streams of a run;
- ``validation``: validation top-1 on every replica during training;
- ``metrics``: accuracy counted a batch at a time, the forward pass that
  evaluation and validation trace;
- ``precision``: the mixed-precision copy of a float model.

The images come from :mod:`edgevit.data`.
"""
