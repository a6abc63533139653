package org.edgevit.demo.core

import java.nio.ByteBuffer
import java.nio.ByteOrder
import kotlin.math.min

/**
 * An image (packed ARGB pixels) to model input bytes, following the model's
 * own recipe from its metadata (docs/model-metadata.md):
 * resize the shorter side to `resize_size`, center-crop `input_size`, scale to
 * [0, 1], `(x - mean) / std` per channel, then quantize for int8/uint8 inputs.
 * A detector ([wholeImage]) is fed the whole image resized to the square input
 * instead, its aspect not kept, as `edgevit eval` and the SSD recipes feed it
 * (objects reach the image's edges; the metadata says "resize of the whole image"),
 * and resized as MediaPipe's ObjectDetector resizes a frame ([MediaPipeResize],
 * whichever filter the metadata names), as `edgevit eval` scores it.
 *
 * Every step matches edgevit's Python preprocessing (`edgevit.data.images`,
 * `edgevit.data.transforms`, `edgevit.litert.run_model.quantize`) exactly,
 * including Pillow's resampling ([PilResize]), Python's round-half-to-even for
 * the resized size, float32 arithmetic for normalisation, and numpy's
 * round-half-to-even when quantizing.
 */
class ImagePreprocessor(
    private val pre: Preprocessing,
    private val input: TensorInfo,
    private val wholeImage: Boolean = false,
) {
    constructor(metadata: ModelMetadata) : this(metadata.preprocessing, metadata.input, metadata.task == Task.DETECTION)

    val inputSize: Int get() = pre.inputSize

    private val mean = FloatArray(3) { pre.mean[it] }
    private val std = FloatArray(3) { pre.std[it] }

    /** Size of the image after the resize (shorter side, or the whole image to the square), and where the crop starts. */
    data class Geometry(val resizedWidth: Int, val resizedHeight: Int, val left: Int, val top: Int)

    fun geometry(width: Int, height: Int): Geometry {
        require(width > 0 && height > 0) { "empty image ($width x $height)" }
        if (wholeImage) return Geometry(pre.inputSize, pre.inputSize, 0, 0)
        val scale = pre.resizeSize.toDouble() / min(width, height)
        // Python's round() rounds halves to even, as Math.rint does.
        val w = maxOf(pre.inputSize, Math.rint(width * scale).toInt())
        val h = maxOf(pre.inputSize, Math.rint(height * scale).toInt())
        return Geometry(w, h, (w - pre.inputSize) / 2, (h - pre.inputSize) / 2)
    }

    /** A rectangle of an image, in its own pixels. */
    data class Crop(val left: Int, val top: Int, val width: Int, val height: Int) {
        /** A coordinate normalised to the model's input (0 to 1 across it), in the image's pixels. */
        fun x(normalised: Float): Float = left + normalised * width
        fun y(normalised: Float): Float = top + normalised * height
    }

    /** The part of a [width] x [height] image the model sees: the crop (a detector: all of it), in the image's pixels. */
    fun cropInImage(width: Int, height: Int): Crop {
        val g = geometry(width, height)
        val sx = width.toDouble() / g.resizedWidth
        val sy = height.toDouble() / g.resizedHeight
        val left = Math.round(g.left * sx).toInt()
        val top = Math.round(g.top * sy).toInt()
        return Crop(
            left, top,
            Math.round(pre.inputSize * sx).toInt().coerceIn(1, width - left),
            Math.round(pre.inputSize * sy).toInt().coerceIn(1, height - top),
        )
    }

    /** Resize and center-crop (a detector: resize the whole image): `input_size` x `input_size` ARGB pixels. */
    fun resizeAndCrop(argb: IntArray, width: Int, height: Int): IntArray {
        if (wholeImage) return MediaPipeResize.resize(argb, width, height, pre.inputSize)
        val g = geometry(width, height)
        return PilResize.resizeAndCrop(
            argb, width, height, g.resizedWidth, g.resizedHeight,
            g.left, g.top, pre.inputSize, pre.inputSize, pre.interpolation,
        )
    }

    /**
     * Cropped pixels to the input's real values, HWC order (R, G, B per pixel): normalised, or where the
     * file normalises itself ([InputKind]), pixels / 255 or the bytes (as values that quantize to the bytes).
     */
    fun normalize(pixels: IntArray): FloatArray {
        val out = FloatArray(pixels.size * 3)
        if (pre.takes != InputKind.NORMALISED) {
            val q = input.quantization
            for (i in pixels.indices) {
                for (c in 0 until 3) {
                    val byte = (pixels[i] shr (16 - 8 * c)) and 0xFF
                    out[i * 3 + c] = if (pre.takes == InputKind.RGB_UNIT) byte / 255f else (byte - q!!.zeroPoint) * q.scale
                }
            }
            return out
        }
        for (i in pixels.indices) {
            val p = pixels[i]
            out[i * 3] = (((p shr 16) and 0xFF).toFloat() / 255f - mean[0]) / std[0]
            out[i * 3 + 1] = (((p shr 8) and 0xFF).toFloat() / 255f - mean[1]) / std[1]
            out[i * 3 + 2] = ((p and 0xFF).toFloat() / 255f - mean[2]) / std[2]
        }
        return out
    }

    /** Write the model input for an image into [out] (see [newInputBuffer]). */
    fun process(argb: IntArray, width: Int, height: Int, out: ByteBuffer) {
        val values = normalize(resizeAndCrop(argb, width, height))
        write(values, out)
    }

    /** Float values to the input tensor's bytes: float32 as is, int8/uint8 quantized. */
    fun write(values: FloatArray, out: ByteBuffer) {
        require(values.size == input.elementCount) { "expected ${input.elementCount} values, got ${values.size}" }
        require(out.remaining() >= input.byteSize) { "input buffer has ${out.remaining()} bytes, needs ${input.byteSize}" }
        when (input.type) {
            TensorType.FLOAT32 -> for (v in values) out.putFloat(v)
            TensorType.INT8, TensorType.UINT8 -> out.put(Quantizer.quantize(values, input.type, input.quantization!!))
        }
    }

    /** A direct, native-order buffer of the input tensor's size (what LiteRT wants). */
    fun newInputBuffer(): ByteBuffer = ByteBuffer.allocateDirect(input.byteSize).order(ByteOrder.nativeOrder())
}

/** int8/uint8 quantization and dequantization, as LiteRT and edgevit define them. */
object Quantizer {
    /** `q = clamp(round_half_even(x / scale) + zero_point)`, with `x / scale` in float32 as numpy computes it. */
    fun quantize(values: FloatArray, type: TensorType, q: Quantization): ByteArray {
        val (lo, hi) = when (type) {
            TensorType.INT8 -> -128.0 to 127.0
            TensorType.UINT8 -> 0.0 to 255.0
            TensorType.FLOAT32 -> throw IllegalArgumentException("float32 tensors are not quantized")
        }
        val out = ByteArray(values.size)
        for (i in values.indices) {
            val scaled = (values[i] / q.scale).toDouble()
            val v = (Math.rint(scaled) + q.zeroPoint).coerceIn(lo, hi)
            out[i] = v.toInt().toByte()
        }
        return out
    }

    /** `x = (q - zero_point) * scale` in float32; uint8 bytes are read unsigned. */
    fun dequantize(raw: ByteArray, type: TensorType, q: Quantization): FloatArray = FloatArray(raw.size) { i ->
        val v = if (type == TensorType.UINT8) raw[i].toInt() and 0xFF else raw[i].toInt()
        (v - q.zeroPoint).toFloat() * q.scale
    }
}
