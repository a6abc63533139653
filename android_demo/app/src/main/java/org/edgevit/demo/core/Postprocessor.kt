package org.edgevit.demo.core

import java.nio.ByteBuffer
import kotlin.math.exp

data class Prediction(val index: Int, val label: String, val probability: Float)

/** Model output bytes to the top-k labels with probabilities. */
object Postprocessor {
    /** Read the output tensor from [buffer] (at its position) as float scores, dequantizing int8/uint8. */
    fun scores(buffer: ByteBuffer, output: TensorInfo): FloatArray {
        val n = output.elementCount
        require(buffer.remaining() >= output.byteSize) { "output buffer has ${buffer.remaining()} bytes, needs ${output.byteSize}" }
        return when (output.type) {
            TensorType.FLOAT32 -> FloatArray(n) { buffer.getFloat() }
            TensorType.INT8, TensorType.UINT8 -> {
                val raw = ByteArray(n)
                buffer.get(raw)
                Quantizer.dequantize(raw, output.type, output.quantization!!)
            }
        }
    }

    /** Numerically stable softmax (max subtracted, sums in double). */
    fun softmax(logits: FloatArray): FloatArray {
        if (logits.isEmpty()) return FloatArray(0)
        var max = Float.NEGATIVE_INFINITY
        for (v in logits) if (v > max) max = v
        val e = DoubleArray(logits.size) { exp((logits[it] - max).toDouble()) }
        val sum = e.sum()
        return FloatArray(logits.size) { (e[it] / sum).toFloat() }
    }

    /** Indices of the [k] largest scores, largest first; ties go to the lower index. NaN ranks last. */
    fun topK(scores: FloatArray, k: Int): IntArray {
        val count = minOf(k, scores.size)
        if (count <= 0) return IntArray(0)
        fun better(a: Int, b: Int): Boolean {
            val x = scores[a]
            val y = scores[b]
            if (x.isNaN()) return false
            if (y.isNaN()) return true
            return x > y || (x == y && a < b)
        }
        // Partial selection: keep the best `count` in order (k is small, e.g. 5 of 1000).
        val best = IntArray(count) { -1 }
        var filled = 0
        for (i in scores.indices) {
            if (filled == count && !better(i, best[count - 1])) continue
            var pos = if (filled < count) filled++ else count - 1
            while (pos > 0 && better(i, best[pos - 1])) {
                best[pos] = best[pos - 1]
                pos--
            }
            best[pos] = i
        }
        return best
    }

    /** Top-[k] predictions from raw scores: softmax applied to logits, probabilities used as they are. */
    fun classify(scores: FloatArray, kind: OutputKind, labels: List<String>, k: Int): List<Prediction> {
        val probabilities = if (kind == OutputKind.LOGITS) softmax(scores) else scores
        return topK(probabilities, k).map { i ->
            Prediction(i, labels.getOrElse(i) { "class $i" }, probabilities[i])
        }
    }
}
