package org.edgevit.demo.core

import kotlin.math.ceil

/**
 * Pillow's `Image.resize` for RGB images with the bilinear or bicubic filter,
 * reproduced bit for bit so the app feeds a model exactly what edgevit's Python
 * preprocessing (`edgevit.data.images`) feeds it.
 *
 * Pillow resamples with a separable convolution whose kernel widens with the
 * downscale factor (an antialiasing filter, unlike Android's
 * `Bitmap.createScaledBitmap`): a horizontal pass then a vertical pass, each
 * rounding to 8 bits with 22-bit fixed-point weights. The arithmetic below
 * follows the same steps in the same order (doubles for the weights, Int for
 * the sums), so results are identical, not just close.
 *
 * Pixels are packed ARGB ints (Android's `Bitmap.getPixels` layout); alpha is
 * ignored and written as 255.
 */
object PilResize {
    private const val PRECISION_BITS = 32 - 8 - 2

    private fun filterSupport(filter: Interpolation) = when (filter) {
        Interpolation.BILINEAR -> 1.0
        Interpolation.BICUBIC -> 2.0
    }

    private fun filterWeight(filter: Interpolation, x0: Double): Double {
        val x = if (x0 < 0.0) -x0 else x0
        return when (filter) {
            Interpolation.BILINEAR -> if (x < 1.0) 1.0 - x else 0.0
            Interpolation.BICUBIC -> {
                val a = -0.5
                when {
                    x < 1.0 -> ((a + 2.0) * x - (a + 3.0)) * x * x + 1
                    x < 2.0 -> (((x - 5) * x + 8) * x - 4) * a
                    else -> 0.0
                }
            }
        }
    }

    /** Per output index: first input index, tap count, and [ksize] fixed-point weights. */
    private class Coefficients(val ksize: Int, val bounds: IntArray, val weights: IntArray)

    private fun coefficients(inSize: Int, outSize: Int, filter: Interpolation): Coefficients {
        val scale = inSize.toDouble() / outSize
        val filterScale = if (scale < 1.0) 1.0 else scale
        val support = filterSupport(filter) * filterScale
        val ksize = ceil(support).toInt() * 2 + 1
        val weights = DoubleArray(outSize * ksize)
        val bounds = IntArray(outSize * 2)
        for (xx in 0 until outSize) {
            val center = (xx + 0.5) * scale
            var ww = 0.0
            val ss = 1.0 / filterScale
            var xmin = (center - support + 0.5).toInt()
            if (xmin < 0) xmin = 0
            var xmax = (center + support + 0.5).toInt()
            if (xmax > inSize) xmax = inSize
            xmax -= xmin
            val base = xx * ksize
            for (x in 0 until xmax) {
                val w = filterWeight(filter, (x + xmin - center + 0.5) * ss)
                weights[base + x] = w
                ww += w
            }
            for (x in 0 until xmax) {
                if (ww != 0.0) weights[base + x] /= ww
            }
            bounds[xx * 2] = xmin
            bounds[xx * 2 + 1] = xmax
        }
        val fixed = IntArray(weights.size)
        val one = (1 shl PRECISION_BITS).toDouble()
        for (k in weights.indices) {
            val w = weights[k]
            fixed[k] = if (w < 0) (-0.5 + w * one).toInt() else (0.5 + w * one).toInt()
        }
        return Coefficients(ksize, bounds, fixed)
    }

    private fun clip8(v: Int): Int = when {
        v >= (1 shl PRECISION_BITS shl 8) -> 255
        v <= 0 -> 0
        else -> v shr PRECISION_BITS
    }

    private fun rgb(r: Int, g: Int, b: Int) = (0xFF shl 24) or (r shl 16) or (g shl 8) or b

    /**
     * Resize [src] ([width] x [height]) to [outWidth] x [outHeight] as Pillow
     * would, but compute only the [cropWidth] x [cropHeight] window at
     * ([cropLeft], [cropTop]) of the result: the same numbers as resizing the
     * whole image and cropping it afterwards, with less work.
     */
    fun resizeAndCrop(
        src: IntArray, width: Int, height: Int,
        outWidth: Int, outHeight: Int,
        cropLeft: Int, cropTop: Int, cropWidth: Int, cropHeight: Int,
        filter: Interpolation,
    ): IntArray {
        require(src.size >= width * height) { "pixel array smaller than $width x $height" }
        require(cropLeft >= 0 && cropTop >= 0 && cropLeft + cropWidth <= outWidth && cropTop + cropHeight <= outHeight) {
            "crop window outside the resized image"
        }
        val needHorizontal = outWidth != width
        val needVertical = outHeight != height
        val vert = if (needVertical) coefficients(height, outHeight, filter) else null
        // Rows of the source that the kept output rows read.
        val rowFirst: Int
        val rowLast: Int
        if (vert != null) {
            rowFirst = vert.bounds[cropTop * 2]
            val lastRow = cropTop + cropHeight - 1
            rowLast = vert.bounds[lastRow * 2] + vert.bounds[lastRow * 2 + 1]
        } else {
            rowFirst = cropTop
            rowLast = cropTop + cropHeight
        }
        // Horizontal pass: rows rowFirst until rowLast, kept columns only.
        val rows = rowLast - rowFirst
        val stage = IntArray(cropWidth * rows)
        if (needHorizontal) {
            val c = coefficients(width, outWidth, filter)
            val half = 1 shl (PRECISION_BITS - 1)
            for (y in 0 until rows) {
                val rowOffset = (y + rowFirst) * width
                for (cx in 0 until cropWidth) {
                    val xx = cx + cropLeft
                    val xmin = c.bounds[xx * 2]
                    val xmax = c.bounds[xx * 2 + 1]
                    val kBase = xx * c.ksize
                    var s0 = half
                    var s1 = half
                    var s2 = half
                    for (x in 0 until xmax) {
                        val p = src[rowOffset + xmin + x]
                        val k = c.weights[kBase + x]
                        s0 += ((p shr 16) and 0xFF) * k
                        s1 += ((p shr 8) and 0xFF) * k
                        s2 += (p and 0xFF) * k
                    }
                    stage[y * cropWidth + cx] = rgb(clip8(s0), clip8(s1), clip8(s2))
                }
            }
        } else {
            for (y in 0 until rows) {
                for (cx in 0 until cropWidth) {
                    stage[y * cropWidth + cx] = src[(y + rowFirst) * width + cx + cropLeft] or (0xFF shl 24)
                }
            }
        }
        if (vert == null) return stage
        // Vertical pass over the staged rows.
        val out = IntArray(cropWidth * cropHeight)
        val half = 1 shl (PRECISION_BITS - 1)
        for (cy in 0 until cropHeight) {
            val yy = cy + cropTop
            val ymin = vert.bounds[yy * 2] - rowFirst
            val ymax = vert.bounds[yy * 2 + 1]
            val kBase = yy * vert.ksize
            for (cx in 0 until cropWidth) {
                var s0 = half
                var s1 = half
                var s2 = half
                for (y in 0 until ymax) {
                    val p = stage[(ymin + y) * cropWidth + cx]
                    val k = vert.weights[kBase + y]
                    s0 += ((p shr 16) and 0xFF) * k
                    s1 += ((p shr 8) and 0xFF) * k
                    s2 += (p and 0xFF) * k
                }
                out[cy * cropWidth + cx] = rgb(clip8(s0), clip8(s1), clip8(s2))
            }
        }
        return out
    }

    /** Resize the whole image (no crop). */
    fun resize(src: IntArray, width: Int, height: Int, outWidth: Int, outHeight: Int, filter: Interpolation): IntArray =
        resizeAndCrop(src, width, height, outWidth, outHeight, 0, 0, outWidth, outHeight, filter)
}
