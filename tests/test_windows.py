"""Windows of a feature map in rank-4 tensors (edgevit/layers/windows.py):
the partition equals the rank-6 permutation of the reference code for
square windows and for stripes, merging inverts it, the cyclic shift equals
np.roll, Swin's patch merging orders the 2x2 neighbours as the official
code, and a graph of them converts to rank-4 ops with no ROLL or GATHER."""
import keras
import numpy as np
import pytest
from keras import ops

from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.layers import SpaceToChannels
from edgevit.layers.windows import cyclic_shift, merge_windows, partition_windows

MAP = np.random.default_rng(0).normal(size=(2, 6, 8, 5)).astype(np.float32)


def rank6_partition(x, wh, ww):
    """timm's window_partition in numpy."""
    b, h, w, c = x.shape
    return x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, wh * ww, c)


@pytest.mark.parametrize("window", [(2, 2), (3, 4), (6, 2), (6, 8), (1, 8), (3, 1), (2, 8)])
def test_partition_is_the_rank6_permutation_and_merge_inverts_it(window):
    windows = np.asarray(partition_windows(ops.convert_to_tensor(MAP), window))
    np.testing.assert_array_equal(windows, rank6_partition(MAP, *window))
    np.testing.assert_array_equal(np.asarray(merge_windows(ops.convert_to_tensor(windows), (6, 8), window)), MAP)


def test_a_map_that_does_not_divide_into_windows_is_an_error():
    with pytest.raises(ValueError, match="6x8 map does not split into 4x4 windows"):
        partition_windows(ops.convert_to_tensor(MAP), (4, 4))


@pytest.mark.parametrize("shift", [(-3, -3), (3, 3), (2, -1), (0, 5), (-6, 9)])
def test_cyclic_shift_is_roll(shift):
    rolled = np.asarray(cyclic_shift(ops.convert_to_tensor(MAP), shift))
    np.testing.assert_array_equal(rolled, np.roll(MAP, shift, axis=(1, 2)))


def test_space_to_channels_orders_the_neighbours_as_swin_patch_merging():
    merged = np.asarray(SpaceToChannels()(MAP))
    official = np.concatenate([MAP[:, 0::2, 0::2], MAP[:, 1::2, 0::2], MAP[:, 0::2, 1::2], MAP[:, 1::2, 1::2]], -1)
    np.testing.assert_array_equal(merged, official)


def test_shifted_windows_convert_to_rank4_ops_only():
    class ShiftedWindows(keras.layers.Layer):
        def call(self, x):
            windows = partition_windows(cyclic_shift(x, (-1, -2)), (3, 4))
            centred = windows - ops.mean(windows, axis=1, keepdims=True)  # per window: no transpose cancels
            return cyclic_shift(merge_windows(centred, (6, 8), (3, 4)), (1, 2))

    x = keras.Input((6, 8, 5))
    summary = describe(convert(keras.Model(x, ShiftedWindows()(x)), "fp32"))
    assert summary.max_rank == 4
    assert set(summary.op_histogram) == {"STRIDED_SLICE", "CONCATENATION", "RESHAPE", "TRANSPOSE", "MEAN", "SUB"}, \
        summary.op_histogram
