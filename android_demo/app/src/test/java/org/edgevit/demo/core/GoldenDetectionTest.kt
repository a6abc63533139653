package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertThrows
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

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
    private val cases = (Json.parse(File(dir, "detect.expected.json").readText()) as Map<*, *>)["cases"] as List<*>

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
        assertArrayEquals(floatArrayOf(10f, 10f, 5f, 5f), decoding.scales, 0f)
        // the stand-in's first anchor: the centre of an 8x8 grid's first cell, 0.25 high and wide
        assertArrayEquals(floatArrayOf(0.0625f, 0.0625f, 0.25f, 0.25f), decoding.anchors.copyOfRange(0, 4), 0f)
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
            val expected = case as Map<*, *>
            val confidence = (expected["confidence"] as Double).toFloat()
            val postprocessor = SsdPostprocessor(SsdDecoding.read(model), boxesInfo, scoresInfo, confidence)
            val found = postprocessor.process(
                ByteBuffer.wrap(File(dir, "detect.boxes.bin").readBytes()),
                ByteBuffer.wrap(File(dir, "detect.scores.bin").readBytes()),
            )
            val scores = (expected["scores"] as List<*>).map { (it as Double).toFloat() }
            assertEquals("detections at $confidence", scores.size, found.count)
            assertArrayEquals(scores.toFloatArray(), found.scores.copyOf(found.count), 0f)
            assertArrayEquals((expected["classes"] as List<*>).map { (it as Double).toInt() }.toIntArray(),
                found.classes.copyOf(found.count))
            val boxes = (expected["boxes"] as List<*>).flatMap { box -> (box as List<*>).map { (it as Double).toFloat() } }
            assertArrayEquals(boxes.toFloatArray(), found.boxes.copyOf(4 * found.count), 1e-6f)
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
