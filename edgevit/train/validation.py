"""Validation top-1 during training, on every replica of every worker: each
input pipeline scores its shard of the validation images, and the counts are
summed across replicas, so every worker logs the same top-1 and the run
takes no longer on one worker than on the others."""
from __future__ import annotations

import math

from edgevit.data.stream import BATCH_SIZE, ImageStream
from edgevit.data.transforms import normalise
from edgevit.errors import EdgevitError
from edgevit.progress import Progress
from edgevit.train.distribute import workers
from edgevit.train.metrics import forward
from edgevit.train.objectives import objective_for


class Validation:
    """``validation(model)``: {"val_top1": ...} of ``model`` (a segmenter's
    {"val_miou": ..., "val_pixel_accuracy": ...}) on the center
    crops of ``images`` at ``size``. Each model's step is traced once and
    kept for the next call (a run validates the same model after every
    epoch). ``kernel_arithmetic=False``: a QAT model's fake-quant ops alone
    (see :func:`edgevit.quantize.export_trace.fake_quant_only`)."""

    def __init__(self, images: ImageStream, size: int, strategy=None, progress: Progress | None = None,
                 kernel_arithmetic: bool = True):
        import tensorflow as tf

        self.images, self.size = images, size
        self.strategy = strategy or tf.distribute.get_strategy()
        self.progress = progress or Progress(enabled=False)
        self.kernel_arithmetic = kernel_arithmetic
        self._steps: dict[int, tuple] = {}  # id(model) -> (model, its traced step)

    def _batches(self):
        """(batches each replica scores, distributed dataset): every replica
        scores as many full batches (the last ones padded with places that
        are not counted), so no worker waits at the end for a batch that
        never comes, and no replica gets an empty batch."""
        strategy = self.strategy
        replicas = strategy.num_replicas_in_sync
        pipelines = workers(strategy)
        local = replicas // pipelines
        per_pipeline = math.ceil(len(self.images) / pipelines)
        steps = max(1, math.ceil(per_pipeline / (BATCH_SIZE * local)))

        def dataset(context):
            return self.images.evaluation_dataset(self.size, BATCH_SIZE, context.num_input_pipelines,
                                                  context.input_pipeline_id, length=steps * BATCH_SIZE * local)

        return steps, strategy.distribute_datasets_from_function(dataset)

    def _step(self, model, element_spec):
        if id(model) in self._steps:
            return self._steps[id(model)][1]
        import tensorflow as tf

        from edgevit.quantize import graph_rewrites

        strategy, pre = self.strategy, self.images.pre
        logits_of = forward(model, self.kernel_arithmetic)
        objective = objective_for(model)

        def replica(x, y, real):
            logits = logits_of(normalise(tf.ensure_shape(x, (None, *model.inputs[0].shape[1:])), pre))
            # unreadable images and padding keep their places, uncounted
            return objective.counts(logits, y, real), tf.reduce_sum(tf.cast(real, tf.float32))

        def step(x, y, real):
            counts, images = strategy.run(replica, args=(x, y, real))
            return strategy.reduce("SUM", counts, axis=None), strategy.reduce("SUM", images, axis=None)

        traced = graph_rewrites.for_model(model, tf.function(step, input_signature=list(element_spec),
                                                             autograph=False))
        self._steps[id(model)] = (model, traced)
        return traced

    def __call__(self, model) -> dict:
        steps, batches = self._batches()
        step = self._step(model, batches.element_spec)
        total, seen = None, 0.0
        with self.progress.bar("validating", len(self.images), "images") as advance:
            for _, batch in zip(range(steps), batches):
                counts, images = step(*batch)
                total = counts.numpy() if total is None else total + counts.numpy()
                seen += float(images)
                advance(int(images))
        if not seen:  # every worker's count is the global one: all of them end here alike
            tally = self.images.tally
            raise EdgevitError(f"None of the {len(self.images)} validation images could be read"
                               + (f": {tally.summary()}." if len(tally) else "."))
        return objective_for(model).metrics(total)
