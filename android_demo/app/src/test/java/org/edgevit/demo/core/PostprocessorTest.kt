package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Test
import java.nio.ByteBuffer
import java.nio.ByteOrder

class PostprocessorTest {
    @Test
    fun softmaxIsStableAndSumsToOne() {
        val p = Postprocessor.softmax(floatArrayOf(1000f, 1000f, 0f))
        assertEquals(0.5f, p[0], 1e-6f)
        assertEquals(0.5f, p[1], 1e-6f)
        assertEquals(0f, p[2], 1e-6f)
        val q = Postprocessor.softmax(floatArrayOf(1f, 2f, 3f))
        assertEquals(1.0, q.sumOf { it.toDouble() }, 1e-6)
        assertEquals(0.66524096f, q[2], 1e-6f)
    }

    @Test
    fun topKOrdersByScoreAndBreaksTiesByIndex() {
        val scores = floatArrayOf(0.1f, 0.5f, Float.NaN, 0.5f, 0.9f, -1f)
        assertArrayEquals(intArrayOf(4, 1, 3), Postprocessor.topK(scores, 3))
        assertArrayEquals(intArrayOf(4, 1, 3, 0, 5, 2), Postprocessor.topK(scores, 10))
        assertArrayEquals(intArrayOf(), Postprocessor.topK(scores, 0))
    }

    @Test
    fun topKMatchesAFullSort() {
        val rng = java.util.Random(7)
        val scores = FloatArray(1000) { rng.nextInt(50).toFloat() }
        val expected = scores.indices.sortedWith(compareBy({ -scores[it] }, { it })).take(5).toIntArray()
        assertArrayEquals(expected, Postprocessor.topK(scores, 5))
    }

    @Test
    fun dequantizesInt8AndUint8() {
        val q = Quantization(0.5f, -2)
        val int8 = ByteBuffer.wrap(byteArrayOf(-2, 0, 127, -128))
        assertArrayEquals(
            floatArrayOf(0f, 1f, 64.5f, -63f),
            Postprocessor.scores(int8, TensorInfo(listOf(1, 4), TensorType.INT8, q)), 0f,
        )
        val uint8 = ByteBuffer.wrap(byteArrayOf(0, 255.toByte()))
        assertArrayEquals(
            floatArrayOf(-10f, 245f),
            Postprocessor.scores(uint8, TensorInfo(listOf(1, 2), TensorType.UINT8, Quantization(1f, 10))), 0f,
        )
    }

    @Test
    fun readsFloatOutputs() {
        val b = ByteBuffer.allocate(8).order(ByteOrder.nativeOrder())
        b.putFloat(1.5f).putFloat(-2f).rewind()
        assertArrayEquals(
            floatArrayOf(1.5f, -2f),
            Postprocessor.scores(b, TensorInfo(listOf(1, 2), TensorType.FLOAT32, null)), 0f,
        )
    }

    @Test
    fun classifyAppliesSoftmaxToLogitsOnly() {
        val labels = listOf("cat", "dog", "fish")
        val fromLogits = Postprocessor.classify(floatArrayOf(0f, 2f, 1f), OutputKind.LOGITS, labels, 2)
        assertEquals(listOf("dog", "fish"), fromLogits.map { it.label })
        assertEquals(0.66524096f, fromLogits[0].probability, 1e-6f)
        val fromProbabilities = Postprocessor.classify(floatArrayOf(0.2f, 0.3f, 0.5f), OutputKind.PROBABILITIES, labels, 1)
        assertEquals(Prediction(2, "fish", 0.5f), fromProbabilities.single())
        // Fewer labels than classes: a placeholder name, not a crash.
        assertEquals("class 2", Postprocessor.classify(floatArrayOf(0f, 0f, 9f), OutputKind.LOGITS, listOf("a"), 1)[0].label)
    }
}
