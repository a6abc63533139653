"""Images, from folders to model inputs: the one home of listing
(``listing``), decoding (``decode``, ``jpeg_header``), the training and
evaluation transforms of an image and its target (``transforms``), the
datasets of a folder (``folders``), the tf.data stream of a file list
(``stream``), the calibration and validation sets of export (``images``),
labels (``labels``) and the sample photos (``sample_photos``). See
docs/design.md for the path of a batch."""
