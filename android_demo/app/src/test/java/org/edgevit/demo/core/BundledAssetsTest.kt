package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Assume.assumeTrue
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer

/**
 * The files `edgevit bundle` put into the app's assets, read the way the app
 * reads them (a classifier's or a segmenter's). Uses the folder named by the `edgevit.assets.dir` system property
 * (the pytest suite bundles a freshly exported model there), else the app's own
 * src/main/assets; skipped when no model is bundled.
 */
class BundledAssetsTest {
    private val dir: File = System.getProperty("edgevit.assets.dir")?.let(::File) ?: File("src/main/assets")

    @Test
    fun bundledModelMetadataAndLabelsAreReadable() {
        val metadataFile = File(dir, "model.json")
        assumeTrue("no model bundled in $dir", metadataFile.isFile)
        val metadata = ModelMetadata.parse(metadataFile.readText())
        val labels = Labels.parse(File(dir, "labels.txt").readText())
        assertEquals("labels.txt lines", metadata.numClasses, labels.size)
        assertEquals(labels, Labels.choose(metadata, labels))
        val model = File(dir, "model.tflite").readBytes()
        assertEquals("TFL3", String(model, 4, 4, Charsets.US_ASCII))

        // A camera-sized frame becomes exactly one input tensor of the model.
        val pre = ImagePreprocessor(metadata)
        val buffer = pre.newInputBuffer()
        val frame = IntArray(640 * 480) { i -> (0xFF shl 24) or ((i * 31) and 0xFFFFFF) }
        pre.process(frame, 640, 480, buffer)
        assertEquals(0, buffer.remaining())
        assertEquals(metadata.input.byteSize, buffer.capacity())

        if (metadata.task == Task.SEGMENTATION) {
            // The segmenter mode's mask for that frame covers the crop, in the frame's pixels.
            val crop = pre.cropInImage(640, 480)
            val shape = metadata.output.shape
            val mask = ByteArray(crop.width * crop.height)
            MaskUpsampler(shape[1], shape[2], shape[3], crop.height, crop.width)
                .classify(FloatArray(metadata.output.elementCount), mask)
            val legend = Legend(labels, ClassColors.forLabels(labels), labels.size).apply { update(mask, mask.size) }
            assertEquals(listOf(0), legend.entries().map { it.index })
        }
        val detection = metadata.detection
        if (detection?.form == DetectorForm.RAW) {
            // A raw detector's anchors come from the bundled file, and its outputs' bytes become boxes.
            val decoding = SsdDecoding.read(model)
            assertEquals(detection.outputs[0].shape[1], decoding.numBoxes)
            val (boxes, scores) = detection.outputs
            val found = SsdPostprocessor(decoding, boxes, scores, -1f)
                .process(ByteBuffer.allocate(boxes.byteSize), ByteBuffer.allocate(scores.byteSize))
            assertTrue(found.count >= metadata.numClasses) // each class keeps its best box
            assertTrue(found.boxes.copyOf(4 * found.count).all { it.isFinite() })
        }
    }
}
