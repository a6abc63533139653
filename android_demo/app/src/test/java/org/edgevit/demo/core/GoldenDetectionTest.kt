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
 * suppressed over all classes as `edgevit eval` scores a raw file by default
 * (`edgevit.models.box_coding.best_class_nms`, as MediaPipe's ObjectDetector shows it).
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
    fun theDetectionsMatchPythonsDecodeAndBestClassNms() {
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
    fun eachAnchorKeepsItsBestClassAndOneSuppressionRunsOverAllClasses() {
        // Five anchors, regressions 0 (each box is its anchor): 0 is class 2 at 0.9; 1 nearly covers it
        // (class 0 at 0.8) and 4 overlaps it at IoU 0.43 (class 1 at 0.7), both suppressed by a box of
        // another class; 2 and 3 lie apart at 0.4 each, 2 with classes 0 and 1 tied.
        val anchors = floatArrayOf(
            0.25f, 0.25f, 0.2f, 0.2f,
            0.25f, 0.26f, 0.2f, 0.2f,
            0.75f, 0.75f, 0.2f, 0.2f,
            0.75f, 0.25f, 0.2f, 0.2f,
            0.25f, 0.33f, 0.2f, 0.2f,
        )
        val scores = floatArrayOf(
            0.1f, 0.1f, 0.9f,
            0.8f, 0.1f, 0.1f,
            0.4f, 0.4f, 0.1f,
            0.1f, 0.4f, 0.1f,
            0.1f, 0.7f, 0.1f,
        )
        fun buffer(values: FloatArray): ByteBuffer {
            val buffer = ByteBuffer.allocate(4 * values.size).order(ByteOrder.nativeOrder())
            values.forEach { buffer.putFloat(it) }
            buffer.rewind()
            return buffer
        }
        val decoding = SsdDecoding(anchors, floatArrayOf(10f, 10f, 5f, 5f), 3)
        val boxesInfo = TensorInfo(listOf(1, 5, 4), TensorType.FLOAT32, null)
        val scoresInfo = TensorInfo(listOf(1, 5, 3), TensorType.FLOAT32, null)
        for (most in listOf(SsdPostprocessor.DETECTIONS, 2)) {
            val found = SsdPostprocessor(decoding, boxesInfo, scoresInfo, SsdPostprocessor.CONFIDENCE, maxDetections = most)
                .process(buffer(FloatArray(20)), buffer(scores))
            val shown = minOf(3, most)
            assertEquals(shown, found.count)
            assertArrayEquals(intArrayOf(2, 0, 1).copyOf(shown), found.classes.copyOf(shown))
            assertArrayEquals(floatArrayOf(0.9f, 0.4f, 0.4f).copyOf(shown), found.scores.copyOf(shown), 0f)
            val boxes = floatArrayOf(0.15f, 0.15f, 0.35f, 0.35f, 0.65f, 0.65f, 0.85f, 0.85f, 0.65f, 0.15f, 0.85f, 0.35f)
            assertArrayEquals(boxes.copyOf(4 * shown), found.boxes.copyOf(4 * shown), 1e-6f)
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
