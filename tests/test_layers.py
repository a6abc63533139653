"""Shared layers against independent NumPy references of the official maths."""
import numpy as np
import pytest

import keras

import edgevit

from edgevit.layers import (Fold, LayerNorm, MultiHeadSelfAttention, ResizeBilinear,
                            SeparableSelfAttention, Unfold, make_divisible)
from edgevit.layers.windows import WindowMerge, WindowPartition

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.normal(size=shape).astype("float32")


@pytest.mark.parametrize("value,divisor,expected", [(32 * 0.75, 8, 24), (64 * 0.75, 16, 48),
                                                     (64 * 1.25, 16, 80), (16 * 2, 8, 32), (3, 8, 8),
                                                     (62, 16, 64), (13, 8, 16)])
def test_make_divisible(value, divisor, expected):
    assert make_divisible(value, divisor) == expected


def test_layer_norm_matches_keras_layer_normalization():
    x = _rand(2, 16, 24) * 3 + 1
    ours, ref = LayerNorm(epsilon=1e-5), keras.layers.LayerNormalization(epsilon=1e-5)
    ours.build(x.shape), ref.build(x.shape)
    gamma, beta = _rand(24), _rand(24)
    ours.set_weights([gamma, beta]), ref.set_weights([gamma, beta])
    np.testing.assert_allclose(ours(x), ref(x), atol=1e-5)


def test_layer_norm_over_all_axes_is_groupnorm_with_one_group():
    x = _rand(2, 8, 4, 6) * 2
    gamma, beta = _rand(6), _rand(6)
    norm = LayerNorm(axes=(1, 2, 3))
    norm.build(x.shape)
    norm.set_weights([gamma, beta])
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    var = x.var(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(norm(x), (x - mean) / np.sqrt(var + 1e-5) * gamma + beta, atol=1e-5)


def _cvnets_unfold_v1(nchw, p=2):
    """ml-cvnets MobileViT v1 unfolding, transcribed to NumPy: -> [B*P, N, C]."""
    b, c, h, w = nchw.shape
    nh, nw = h // p, w // p
    x = nchw.reshape(b * c * nh, p, nw, p).transpose(0, 2, 1, 3)
    x = x.reshape(b, c, nh * nw, p * p).transpose(0, 3, 2, 1)
    return x.reshape(b * p * p, nh * nw, c)


def _torch_unfold_v2(nchw, p=2):
    """F.unfold(kernel=stride=p) reshaped to [B, C, P, N] as in ml-cvnets v2."""
    b, c, h, w = nchw.shape
    nh, nw = h // p, w // p
    x = nchw.reshape(b, c, nh, p, nw, p).transpose(0, 1, 3, 5, 2, 4)
    return x.reshape(b, c, p * p, nh * nw)


def test_unfold_into_batch_matches_official_layout_and_folds_back():
    nhwc = _rand(2, 6, 8, 5)
    patches = np.asarray(Unfold(2, pixels_in_batch=True)(nhwc))  # pixel-major: [P * B, N, C]
    official = _cvnets_unfold_v1(nhwc.transpose(0, 3, 1, 2)).reshape(2, 4, 12, 5)  # [B, P, N, C]
    np.testing.assert_array_equal(patches.reshape(4, 2, 12, 5).transpose(1, 0, 2, 3), official)
    np.testing.assert_array_equal(Fold((6, 8), 2, pixels_in_batch=True)(patches), nhwc)


def test_unfold_tokens_layout_matches_official_v2_and_folds_back():
    nhwc = _rand(2, 6, 8, 5)
    patches = np.asarray(Unfold(2, pixels_in_batch=False)(nhwc))  # [B, N, P, C]
    np.testing.assert_array_equal(patches.transpose(0, 3, 2, 1), _torch_unfold_v2(nhwc.transpose(0, 3, 1, 2)))
    np.testing.assert_array_equal(Fold((6, 8), 2, pixels_in_batch=False)(patches), nhwc)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_multi_head_attention_matches_reference():
    x = _rand(3, 10, 16)
    attn = MultiHeadSelfAttention(16, 4)
    out = np.asarray(attn(x))
    wqkv, bqkv, wo, bo = [w.numpy() for w in attn.weights]
    qkv = (x @ wqkv + bqkv).reshape(3, 10, 3, 4, 4).transpose(2, 0, 3, 1, 4)  # timm's layout
    q, k, v = qkv
    a = _softmax(q @ k.transpose(0, 1, 3, 2) / 2.0)
    expected = (a @ v).transpose(0, 2, 1, 3).reshape(3, 10, 16) @ wo + bo
    np.testing.assert_allclose(out, expected, atol=1e-4)


def test_separable_attention_matches_cvnets_formula():
    x = _rand(2, 12, 4, 8)  # [B, N, P, C]
    attn = SeparableSelfAttention(8)
    out = np.asarray(attn(x))
    wqkv, bqkv, wo, bo = [w.numpy() for w in attn.weights]
    nchw = x.transpose(0, 3, 2, 1)  # [B, C, P, N] as in ml-cvnets
    qkv = np.einsum("bcpn,cd->bdpn", nchw, wqkv) + bqkv[None, :, None, None]
    q, k, v = qkv[:, :1], qkv[:, 1:9], qkv[:, 9:]
    scores = _softmax(q, axis=-1)
    context = (k * scores).sum(-1, keepdims=True)
    y = np.maximum(v, 0) * context
    expected = np.einsum("bcpn,cd->bdpn", y, wo) + bo[None, :, None, None]
    np.testing.assert_allclose(out, expected.transpose(0, 3, 2, 1), atol=1e-4)


def _bilinear_reference(img, out_h, out_w, align_corners):
    """PyTorch's F.interpolate(mode='bilinear') for one HxW plane."""
    h, w = img.shape

    def coords(n_out, n_in):
        i = np.arange(n_out, dtype=np.float64)
        if align_corners:
            return i * (n_in - 1) / max(n_out - 1, 1)
        return np.clip((i + 0.5) * n_in / n_out - 0.5, 0, None)

    ys, xs = coords(out_h, h), coords(out_w, w)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = img[y0][:, x0] * (1 - wx) + img[y0][:, x1] * wx
    bottom = img[y1][:, x0] * (1 - wx) + img[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


@pytest.mark.parametrize("align_corners", [False, True])
def test_resize_bilinear_matches_pytorch_semantics(align_corners):
    x = _rand(1, 7, 7, 1)
    out = np.asarray(ResizeBilinear((8, 8), align_corners=align_corners)(x))[0, :, :, 0]
    np.testing.assert_allclose(out, _bilinear_reference(x[0, :, :, 0], 8, 8, align_corners), atol=1e-5)


@pytest.mark.parametrize("name", ["mobilevit_v3_xxs", "vit_tiny16"])
def test_random_init_gives_every_layer_its_own_weights_and_repeats_after_reseeding(name):
    """Shared initializer instances would hand every kernel of one shape the
    same values, drawn from a seed fixed at import time."""
    keras.utils.set_random_seed(0)
    first = edgevit.create_model(name, num_classes=10, input_size=64)
    edgevit.create_model("mobilevit_v1_xxs", num_classes=10, input_size=64)  # draws more seeds
    keras.utils.set_random_seed(0)
    again = edgevit.create_model(name, num_classes=10, input_size=64)
    for a, b in zip(first.weights, again.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    by_shape: dict[tuple, list[np.ndarray]] = {}
    for w in first.weights:
        if w.path.endswith("kernel"):
            by_shape.setdefault(tuple(w.shape), []).append(np.asarray(w))
    repeated = [s for s, ks in by_shape.items() if any(np.array_equal(ks[0], k) for k in ks[1:])]
    assert not repeated, repeated


def _windows_reference(x, wh, ww):
    """Windows as the official CSWin / Swin code cuts them: the rank-6 view
    ``[B, H/wh, wh, W/ww, ww, C]``, window axes first."""
    b, h, w, c = x.shape
    return x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, wh, ww, c)


@pytest.mark.parametrize("window", [(4, 2), (2, 8), (1, 8), (4, 1), (2, 4), (1, 1), (4, 8)])
def test_window_partition_matches_the_rank6_view_and_merges_back(window):
    x = _rand(2, 4, 8, 3)
    windows = WindowPartition(window)(x)
    np.testing.assert_array_equal(windows, _windows_reference(x, *window))
    np.testing.assert_array_equal(WindowMerge((4, 8))(windows), x)
    assert WindowPartition(window).compute_output_shape(x.shape) == windows.shape
    assert WindowMerge((4, 8)).compute_output_shape(windows.shape) == x.shape


def test_window_partition_needs_windows_that_tile_the_map():
    with pytest.raises(ValueError, match="a 4x8 map does not split into 3x8 windows"):
        WindowPartition((3, 8))(_rand(1, 4, 8, 3))
