package org.edgevit.demo.core

import java.nio.ByteBuffer
import kotlin.math.abs
import kotlin.math.ceil
import kotlin.math.floor

/**
 * A segmenter's logits `[h, w, classes]` (at its output stride) to the class of every pixel of a
 * [height] x [width] mask: the logits resized bilinearly with the corners aligned, in float32, then
 * the argmax (ties: the lower class). That is how `edgevit eval` scores a file
 * (`edgevit.train.metrics.upsampled_classes`), so the app shows what edgevit measured, and how
 * nearly how MediaPipe's ImageSegmenter makes its category mask (at least 98% of pixels agree). Argmaxing at the output stride and scaling the mask would be cheaper but
 * gives blocky edges 16 pixels wide and a different mask from the one evaluated.
 *
 * Separable: the rows first ([height] x w x classes), then each output pixel's argmax over its two
 * columns, among the classes that can win there: an interpolated value lies between its four
 * corners, so a class whose highest corner is below another class's lowest one never wins inside
 * that cell. Where each region has a clear winner (a trained segmenter's logits) few classes are
 * left: 32x32x21 logits to a 480x480 mask took 6 ms instead of 25 on a desktop JVM, for the same
 * mask. Every buffer is made here, once: [classify] allocates nothing.
 */
class MaskUpsampler(
    val sourceHeight: Int,
    val sourceWidth: Int,
    val classes: Int,
    val height: Int,
    val width: Int,
) {
    init {
        require(sourceHeight > 0 && sourceWidth > 0 && height > 0 && width > 0) { "empty logits or mask" }
        require(classes in 1..MAX_CLASSES) { "$classes classes: a mask byte holds at most $MAX_CLASSES" }
    }

    private val rowsLow = IntArray(height)
    private val rowsHigh = IntArray(height)
    private val rowsFraction = FloatArray(height)
    private val columnsLow = IntArray(width)
    private val columnsHigh = IntArray(width)
    private val columnsFraction = FloatArray(width)
    private val rows = FloatArray(height * sourceWidth * classes)

    // Per cell (the logits at (i, j), (i, j + 1), (i + 1, j), (i + 1, j + 1), keyed by i * w + j): the
    // classes that can win inside it, ascending, from candidates[cell * classes], candidateCounts[cell] of them.
    private val candidates = IntArray(sourceHeight * sourceWidth * classes)
    private val candidateCounts = IntArray(sourceHeight * sourceWidth)

    init {
        cornerAligned(sourceHeight, height, rowsLow, rowsHigh, rowsFraction)
        cornerAligned(sourceWidth, width, columnsLow, columnsHigh, columnsFraction)
    }

    /** The class of each mask pixel, row by row, into [mask] (unsigned bytes); [logits] as [readLogits] fills it. */
    fun classify(logits: FloatArray, mask: ByteArray) {
        require(logits.size == sourceHeight * sourceWidth * classes) { "expected ${sourceHeight * sourceWidth * classes} logits, got ${logits.size}" }
        require(mask.size >= height * width) { "mask has ${mask.size} bytes, needs ${height * width}" }
        findCandidates(logits)
        val rowLength = sourceWidth * classes
        for (y in 0 until height) {
            val low = rowsLow[y] * rowLength
            val high = rowsHigh[y] * rowLength
            val t = rowsFraction[y]
            val out = y * rowLength
            for (i in 0 until rowLength) {
                val a = logits[low + i]
                rows[out + i] = a + (logits[high + i] - a) * t
            }
        }
        for (y in 0 until height) {
            val row = y * rowLength
            val cellRow = rowsLow[y] * sourceWidth
            for (x in 0 until width) {
                val left = row + columnsLow[x] * classes
                val right = row + columnsHigh[x] * classes
                val t = columnsFraction[x]
                val cell = cellRow + columnsLow[x]
                val first = cell * classes
                var best = candidates[first]
                var bestValue = rows[left + best] + (rows[right + best] - rows[left + best]) * t
                for (n in 1 until candidateCounts[cell]) {
                    val c = candidates[first + n]
                    val a = rows[left + c]
                    val v = a + (rows[right + c] - a) * t
                    if (v > bestValue) {
                        bestValue = v
                        best = c
                    }
                }
                mask[y * width + x] = best.toByte()
            }
        }
    }

    /** Fill [candidates] for every cell of [logits]. */
    private fun findCandidates(logits: FloatArray) {
        var largest = 0f
        for (v in logits) largest = maxOf(largest, abs(v))
        // float32 interpolation lands at most a few ulps outside its corners: a class within this margin
        // of winning is kept. With a NaN anywhere every class is kept, so NaN ranks as it did unpruned.
        val margin = if (largest.isNaN()) Float.NaN else 1e-4f * (1f + largest)
        for (i in 0 until sourceHeight) {
            val below = minOf(i + 1, sourceHeight - 1)
            for (j in 0 until sourceWidth) {
                val cell = i * sourceWidth + j
                val right = minOf(j + 1, sourceWidth - 1)
                val a = cell * classes
                val b = (i * sourceWidth + right) * classes
                val c = (below * sourceWidth + j) * classes
                val d = (below * sourceWidth + right) * classes
                // Some class is at least this high everywhere in the cell.
                var bound = Float.NEGATIVE_INFINITY
                for (k in 0 until classes) {
                    bound = maxOf(bound, minOf(minOf(logits[a + k], logits[b + k]), minOf(logits[c + k], logits[d + k])))
                }
                var count = 0
                for (k in 0 until classes) {
                    val highest = maxOf(maxOf(logits[a + k], logits[b + k]), maxOf(logits[c + k], logits[d + k]))
                    if (margin.isNaN() || highest + margin >= bound) candidates[a + count++] = k
                }
                candidateCounts[cell] = count
            }
        }
    }

    companion object {
        const val MAX_CLASSES = 256

        /**
         * Where each of [target] places falls on [source] ones, corners on corners, in float32 as numpy
         * computes it: the lower and upper neighbour and the fraction between them.
         */
        private fun cornerAligned(source: Int, target: Int, low: IntArray, high: IntArray, fraction: FloatArray) {
            val scale = (source - 1).toFloat() / maxOf(target - 1, 1).toFloat()
            for (i in 0 until target) {
                val at = i.toFloat() * scale
                low[i] = maxOf(floor(at), 0f).toInt()
                high[i] = minOf(ceil(at).toInt(), source - 1)
                fraction[i] = (at - low[i]).coerceIn(0f, 1f)
            }
        }

        /** The output tensor at [buffer]'s position into [into] as float logits, dequantizing int8/uint8. */
        fun readLogits(buffer: ByteBuffer, output: TensorInfo, into: FloatArray) {
            require(into.size == output.elementCount) { "expected room for ${output.elementCount} logits, got ${into.size}" }
            require(buffer.remaining() >= output.byteSize) { "output buffer has ${buffer.remaining()} bytes, needs ${output.byteSize}" }
            when (output.type) {
                TensorType.FLOAT32 -> for (i in into.indices) into[i] = buffer.getFloat()
                TensorType.INT8, TensorType.UINT8 -> {
                    val q = output.quantization!!
                    val unsigned = output.type == TensorType.UINT8
                    for (i in into.indices) {
                        val raw = buffer.get().toInt()
                        into[i] = ((if (unsigned) raw and 0xFF else raw) - q.zeroPoint).toFloat() * q.scale
                    }
                }
            }
        }
    }
}

/**
 * One opaque colour per class: the PASCAL VOC palette (each class index's bits spread over the
 * high bits of red, green and blue), so VOC models show their usual colours and any other model
 * gets distinct ones. A class labelled "background" is left transparent: the frame shows through.
 */
object ClassColors {
    const val TRANSPARENT = 0

    fun palette(index: Int): Int {
        var r = 0
        var g = 0
        var b = 0
        var c = index
        for (bit in 7 downTo 0) {
            r = r or ((c and 1) shl bit)
            g = g or (((c shr 1) and 1) shl bit)
            b = b or (((c shr 2) and 1) shl bit)
            c = c shr 3
        }
        return (0xFF shl 24) or (r shl 16) or (g shl 8) or b
    }

    /** The ARGB colour each of [labels] is painted with. */
    fun forLabels(labels: List<String>): IntArray = IntArray(labels.size) { i ->
        if (labels[i].equals("background", ignoreCase = true)) TRANSPARENT else palette(i)
    }
}

/** A class in the legend: its share of the mask, and that share as shown, in whole percent. */
data class LegendEntry(val index: Int, val label: String, val color: Int, val share: Float, val percent: Int)

/**
 * The classes present in a mask with their share of it, largest first (ties: the lower class), at most
 * [lines] of them. [update] counts a mask without allocating and says whether what the legend shows
 * changed (a class listed, the order, or a share in whole percent), so its text is built only then.
 */
class Legend(private val labels: List<String>, private val colors: IntArray, private val lines: Int) {
    private val counts = IntArray(labels.size)
    private val listed = IntArray(lines)
    private val percents = IntArray(lines)
    private var listedCount = 0
    private var pixels = 0

    /** Count the classes of [mask]'s first [pixels] bytes; true when the listing differs from the last one. */
    fun update(mask: ByteArray, pixels: Int): Boolean {
        require(pixels > 0 && pixels <= mask.size) { "$pixels pixels of a ${mask.size}-byte mask" }
        counts.fill(0)
        for (i in 0 until pixels) counts[mask[i].toInt() and 0xFF]++
        this.pixels = pixels
        var changed = false
        var count = 0
        while (count < lines) {
            // The largest class not listed yet: after the one above it in count, or equal and higher in index.
            var best = -1
            for (c in counts.indices) {
                if (counts[c] == 0 || (best >= 0 && counts[c] <= counts[best])) continue
                if (count > 0 && !ranksBelow(c, listed[count - 1])) continue
                best = c
            }
            if (best < 0) break
            val percent = ((100L * counts[best] + pixels / 2) / pixels).toInt()
            if (count >= listedCount || listed[count] != best || percents[count] != percent) changed = true
            listed[count] = best
            percents[count] = percent
            count++
        }
        if (count != listedCount) changed = true
        listedCount = count
        return changed
    }

    /** What the last [update] listed, largest first. */
    fun entries(): List<LegendEntry> = List(listedCount) { i ->
        val c = listed[i]
        LegendEntry(c, labels[c], colors[c], counts[c].toFloat() / pixels, percents[i])
    }

    /** [c] comes after [above] in the listing: fewer pixels, or as many and a higher index. */
    private fun ranksBelow(c: Int, above: Int): Boolean =
        counts[c] < counts[above] || (counts[c] == counts[above] && c > above)
}
