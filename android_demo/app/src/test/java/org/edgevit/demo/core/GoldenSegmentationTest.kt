package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer

/**
 * The segmenter mode's pure logic against Python on the `segment.*` case of
 * offline-check/make_golden.py: raw logits of a real int8 segmenter file,
 * dequantized, upsampled and argmaxed (`edgevit.train.metrics.upsampled_classes`),
 * then the legend and the class colours.
 */
class GoldenSegmentationTest {
    private val dir: File = System.getProperty("edgevit.golden.dir")?.let(::File)
        ?: File(javaClass.getResource("/golden/cases.txt")!!.toURI()).parentFile

    private val metadata = ModelMetadata.parse(File(dir, "segment.json").readText())
    private val expected = Json.parse(File(dir, "segment.expected.json").readText()) as Map<*, *>
    private val height = (expected["mask_height"] as Double).toInt()
    private val width = (expected["mask_width"] as Double).toInt()

    private fun mask(): ByteArray {
        val shape = metadata.output.shape
        val logits = FloatArray(metadata.output.elementCount)
        MaskUpsampler.readLogits(ByteBuffer.wrap(File(dir, "segment.logits.bin").readBytes()), metadata.output, logits)
        val mask = ByteArray(height * width)
        MaskUpsampler(shape[1], shape[2], shape[3], height, width).classify(logits, mask)
        return mask
    }

    @Test
    fun theSegmenterMetadataIsReadAsASegmenter() {
        assertEquals(Task.SEGMENTATION, metadata.task)
        assertEquals(metadata.output.shape.last(), metadata.numClasses)
    }

    @Test
    fun theCategoryMaskMatchesPython() {
        assertArrayEquals(File(dir, "segment.mask.bin").readBytes(), mask())
    }

    @Test
    fun theLegendAndTheColoursMatchPython() {
        val colors = ClassColors.forLabels(metadata.labels)
        assertArrayEquals((expected["colors"] as List<*>).map { (it as Double).toInt() }.toIntArray(), colors)
        val legend = Legend(metadata.labels, colors, metadata.labels.size)
            .apply { update(mask(), height * width) }.entries()
        val wanted = expected["legend"] as List<*>
        assertEquals(wanted.map { ((it as Map<*, *>)["index"] as Double).toInt() }, legend.map { it.index })
        for ((entry, e) in legend.zip(wanted)) {
            assertEquals(((e as Map<*, *>)["share"] as Double), entry.share.toDouble(), 1e-6)
            assertEquals(metadata.labels[entry.index], entry.label)
        }
    }
}
