package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The app's postprocessing against Python on the `postprocess.*` cases of
 * offline-check/make_golden.py: 1000 raw int8/uint8 outputs, dequantized
 * exactly as `edgevit.litert.run_model.dequantize` does, then softmax and the
 * top-5 (ties to the lower index) as numpy computes them.
 */
class GoldenPostprocessingTest {
    private val dir: File = System.getProperty("edgevit.golden.dir")?.let(::File)
        ?: File(javaClass.getResource("/golden/cases.txt")!!.toURI()).parentFile

    @Test
    fun dequantizeSoftmaxAndTop5MatchPython() {
        for (dtype in listOf("int8", "uint8")) {
            val expected = Json.parse(File(dir, "postprocess.$dtype.json").readText()) as Map<*, *>
            val q = expected["quantization"] as Map<*, *>
            val raw = File(dir, "postprocess.$dtype.bin").readBytes()
            val info = TensorInfo(
                listOf(1, raw.size), TensorType.of(dtype),
                Quantization((q["scale"] as Double).toFloat(), (q["zero_point"] as Double).toInt()),
            )
            val scores = Postprocessor.scores(ByteBuffer.wrap(raw), info)
            val pythonScores = FloatArray(raw.size)
            ByteBuffer.wrap(File(dir, "postprocess.$dtype.scores.bin").readBytes())
                .order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(pythonScores)
            assertArrayEquals("dequantized $dtype", pythonScores, scores, 0f)

            val top = Postprocessor.classify(scores, OutputKind.LOGITS, List(raw.size) { "c$it" }, 5)
            val expectedTop = (expected["top5"] as List<*>).map { (it as Double).toInt() }
            assertEquals("top-5 of $dtype", expectedTop, top.map { it.index })
            val expectedP = (expected["top5_probabilities"] as List<*>).map { it as Double }
            for ((p, e) in top.map { it.probability }.zip(expectedP)) assertEquals(e, p.toDouble(), 1e-6 * e)
        }
    }
}
