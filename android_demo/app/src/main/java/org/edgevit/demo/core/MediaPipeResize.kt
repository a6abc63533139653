package org.edgevit.demo.core

/**
 * The whole frame resized to a square as MediaPipe Tasks' ObjectDetector
 * resizes it on the CPU (OpenCV's bilinear warp), reproduced bit for bit from
 * `edgevit.data.transforms.mediapipe_resize`, the resize `edgevit eval` scores
 * a detector with: what the app feeds a detector is what eval measured and
 * what a MediaPipe app shows.
 *
 * Unlike Pillow's filter ([PilResize]) there is no antialiasing: output pixel
 * j samples the frame at j * side / size (not at pixel centres), that position
 * rounded half to even to 1/32 px as numpy's `rint` rounds it, and its two
 * neighbours along each axis (edges repeated) are weighted in 1/32 steps.
 * The four products are summed in integers and rounded once, as OpenCV's
 * fixed-point weights round them.
 *
 * Pixels are packed ARGB ints (Android's `Bitmap.getPixels` layout); alpha is
 * ignored and written as 255.
 */
object MediaPipeResize {
    // OpenCV's INTER_BITS: sample positions in 1/32 px
    private const val POSITION_BITS = 5
    private const val STEPS = 1 shl POSITION_BITS
    private const val SHIFT = 2 * POSITION_BITS

    /** Per output position along an axis: the two source indices and their weights (in 1/[STEPS], summing to it). */
    private class Taps(val first: IntArray, val second: IntArray, val firstWeight: IntArray, val secondWeight: IntArray)

    private fun taps(side: Int, size: Int): Taps {
        val ratio = side.toDouble() / size
        val taps = Taps(IntArray(size), IntArray(size), IntArray(size), IntArray(size))
        for (j in 0 until size) {
            // j * ratio * STEPS in float64, in numpy's order, so halves fall where Python's do
            val position = Math.rint(j * ratio * STEPS).toLong()
            val index = (position / STEPS).toInt()
            val fraction = (position % STEPS).toInt()
            taps.first[j] = index.coerceIn(0, side - 1)
            taps.second[j] = (index + 1).coerceIn(0, side - 1)
            taps.firstWeight[j] = STEPS - fraction
            taps.secondWeight[j] = fraction
        }
        return taps
    }

    /** [src] ([width] x [height]) resized to a [size] x [size] square: packed ARGB pixels, row by row. */
    fun resize(src: IntArray, width: Int, height: Int, size: Int): IntArray {
        require(width > 0 && height > 0 && size > 0) { "cannot resize $width x $height to $size x $size" }
        require(src.size >= width * height) { "pixel array smaller than $width x $height" }
        val rows = taps(height, size)
        val columns = taps(width, size)
        val out = IntArray(size * size)
        for (i in 0 until size) {
            val top = rows.first[i] * width
            val bottom = rows.second[i] * width
            for (j in 0 until size) {
                val topLeft = src[top + columns.first[j]]
                val topRight = src[top + columns.second[j]]
                val bottomLeft = src[bottom + columns.first[j]]
                val bottomRight = src[bottom + columns.second[j]]
                var argb = 0xFF shl 24
                var shift = 16
                while (shift >= 0) {
                    // along the rows first, then the columns: integer sums, so the same total as OpenCV's products
                    val left = ((topLeft shr shift) and 0xFF) * rows.firstWeight[i] + ((bottomLeft shr shift) and 0xFF) * rows.secondWeight[i]
                    val right = ((topRight shr shift) and 0xFF) * rows.firstWeight[i] + ((bottomRight shr shift) and 0xFF) * rows.secondWeight[i]
                    val total = left * columns.firstWeight[j] + right * columns.secondWeight[j]
                    argb = argb or (((total + (1 shl (SHIFT - 1))) shr SHIFT) shl shift)
                    shift -= 8
                }
                out[i * size + j] = argb
            }
        }
        return out
    }
}
