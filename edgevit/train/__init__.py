"""Fine-tuning and quantization-aware training on image folders.

- ``data``: the datasets (file lists) of an image folder and the per-image
  transforms (stored square, random resized crop, center crop);
- ``pipeline``: the tf.data input pipeline over a file list (epoch plans,
  parallel reading, unreadable images counted);
- ``distribute``: the tf.distribute strategy, the chief, broadcasts from it,
  synchronised BatchNorm, the worker watchdog;
- ``loop``: the Trainer (steps on every replica, epochs, resume);
- ``checkpoints``: per-epoch checkpoints and the lock of their folder;
- ``validation``: validation top-1 on every replica during training;
- ``precision``: the mixed-precision copy of a float model;
- ``prepare``: building the model and the image streams of a command;
- ``metrics``: accuracy counted a batch at a time, the traced forward pass.
"""
