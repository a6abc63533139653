package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertThrows
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder
import kotlin.math.abs

/**
 * The detector mode's pure logic against Python on the `detect.*` case of
 * offline-check/make_golden.py: a real int8 detector file's raw uint8 outputs
 * for a photo, decoded against the anchors its own metadata carries and
 * suppressed class by class as `edgevit.models.box_coding` does.
 */
class GoldenDetectionTest {
    private val dir: File = System.getProperty("edgevit.golden.dir")?.let(::File)
        ?: File(javaClass.getResource("/golden/cases.txt")!!.toURI()).parentFile

    private val metadata = ModelMetadata.parse(File(dir, "detect.json").readText())
    private val model = File(dir, "detect.tflite").readBytes()
    private val expected = Json.parse(File(dir, "detect.expected.json").readText()) as Map<*, *>
    private val cases = expected["cases"] as List<*>

    private fun floats(values: Any?): FloatArray =
        (values as List<*>).flatMap { v -> if (v is List<*>) v.map { (it as Double).toFloat() } else listOf((v as Double).toFloat()) }
            .toFloatArray()

    @Test
    fun theDetectorMetadataIsReadAsARawDetector() {
        assertEquals(Task.DETECTION, metadata.task)
        val detection = metadata.detection!!
        assertEquals(DetectorForm.RAW, detection.form)
        assertEquals(metadata.numClasses, detection.outputs[1].shape.last())
    }

    @Test
    fun theAnchorsAndScalesComeFromTheFilesOwnMetadata() {
        val decoding = SsdDecoding.read(model)
        assertEquals(metadata.detection!!.outputs[0].shape[1], decoding.numBoxes)
        assertEquals(metadata.numClasses, decoding.numClasses)
        assertArrayEquals(floats(expected["scales"]), decoding.scales, 0f)
        assertArrayEquals(floats(expected["anchors"]), decoding.anchors, 0f)
    }

    @Test
    fun aFileWithoutDetectorMetadataIsOneClearError() {
        val error = assertThrows(MetadataException::class.java) { SsdDecoding.read(model.copyOfRange(0, 64)) }
        assertEquals("the model's metadata is cut short", error.message)
    }

    @Test
    fun theDetectionsMatchPythonsDecodeAndPerClassNms() {
        val (boxesInfo, scoresInfo) = metadata.detection!!.outputs
        for (case in cases) {
            val wanted = case as Map<*, *>
            val confidence = (wanted["confidence"] as Double).toFloat()
            val postprocessor = SsdPostprocessor(SsdDecoding.read(model), boxesInfo, scoresInfo, confidence)
            val found = postprocessor.process(
                ByteBuffer.wrap(File(dir, "detect.boxes.bin").readBytes()),
                ByteBuffer.wrap(File(dir, "detect.scores.bin").readBytes()),
            )
            val scores = floats(wanted["scores"])
            assertEquals("detections at $confidence", scores.size, found.count)
            assertArrayEquals(scores, found.scores.copyOf(found.count), 0f)
            assertArrayEquals((wanted["classes"] as List<*>).map { (it as Double).toInt() }.toIntArray(),
                found.classes.copyOf(found.count))
            val boxes = floats(wanted["boxes"])
            // float32 exp may differ from numpy's in the last bit: boxes agree to a few ulps
            for ((i, value) in boxes.withIndex()) assertEquals("box value $i", value, found.boxes[i], 1e-6f * maxOf(1f, abs(value)))
        }
    }

    @Test
    fun theNmsFormsOutputsAreReadUpToTheirCount() {
        fun floats(vararg values: Float): ByteBuffer {
            val buffer = ByteBuffer.allocate(4 * values.size).order(ByteOrder.nativeOrder())
            values.forEach { buffer.putFloat(it) }
            return buffer
        }
        val found = NmsOutputs.read(
            floats(0.1f, 0.2f, 0.5f, 0.6f, 0.3f, 0.3f, 0.9f, 0.8f, 0f, 0f, 0f, 0f),
            floats(2f, 0f, 0f), floats(0.9f, 0.4f, 0f), floats(2f), Detections(3),
        )
        assertEquals(2, found.count)
        assertArrayEquals(intArrayOf(2, 0), found.classes.copyOf(2))
        assertArrayEquals(floatArrayOf(0.9f, 0.4f), found.scores.copyOf(2), 0f)
        assertArrayEquals(floatArrayOf(0.1f, 0.2f, 0.5f, 0.6f, 0.3f, 0.3f, 0.9f, 0.8f), found.boxes.copyOf(8), 0f)
    }
}
