package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Test

class SegmentationTest {
    @Test
    fun equalLogitsGoToTheLowerClassAndAOnePixelMapFillsTheMask() {
        val mask = ByteArray(6)
        MaskUpsampler(1, 1, 3, 2, 3).classify(floatArrayOf(0.5f, 2f, 2f), mask)
        assertArrayEquals(ByteArray(6) { 1 }, mask)
    }

    @Test
    fun cornersKeepTheirClassAndTheMiddleIsInterpolated() {
        // 1 x 2 logits of 2 classes: class 0 wins on the left, class 1 on the right, by 1 each.
        val mask = ByteArray(5)
        MaskUpsampler(1, 2, 2, 1, 5).classify(floatArrayOf(1f, 0f, 0f, 1f), mask)
        // The middle pixel ties at 0.5 each: the lower class.
        assertArrayEquals(byteArrayOf(0, 0, 0, 1, 1), mask)
    }

    @Test
    fun classIndicesAboveOneHundredTwentySevenSurviveTheMaskByte() {
        val logits = FloatArray(200).also { it[199] = 1f }
        val mask = ByteArray(1)
        MaskUpsampler(1, 1, 200, 1, 1).classify(logits, mask)
        assertEquals(199, mask[0].toInt() and 0xFF)
        val legend = Legend(List(200) { "c$it" }, IntArray(200)).of(mask, 1)
        assertEquals(listOf(LegendEntry(199, "c199", 0, 1f)), legend)
    }

    @Test
    fun theVocPaletteAndATransparentBackground() {
        assertEquals(0xFF800000.toInt(), ClassColors.palette(1))
        assertEquals(0xFFC08080.toInt(), ClassColors.palette(15)) // VOC's "person"
        assertArrayEquals(intArrayOf(0, ClassColors.palette(1)), ClassColors.forLabels(listOf("background", "cat")))
    }

    @Test
    fun theCropIsPlacedInTheFramesOwnPixels() {
        val segmenter = Preprocessing(512, 512, Interpolation.BILINEAR, listOf(0f, 0f, 0f), listOf(1f, 1f, 1f), listOf(0f, 1f))
        val input = TensorInfo(listOf(1, 512, 512, 3), TensorType.UINT8, Quantization(1f / 255, 0))
        assertEquals(ImagePreprocessor.Crop(80, 0, 480, 480), ImagePreprocessor(segmenter, input).cropInImage(640, 480))
        assertEquals(ImagePreprocessor.Crop(0, 80, 480, 480), ImagePreprocessor(segmenter, input).cropInImage(480, 640))
        // resize 36, crop 32 of 160 x 120: the resized image is 48 x 36, cropped at (8, 2).
        val classifier = segmenter.copy(inputSize = 32, resizeSize = 36)
        val small = input.copy(shape = listOf(1, 32, 32, 3))
        assertEquals(ImagePreprocessor.Crop(27, 7, 107, 107), ImagePreprocessor(classifier, small).cropInImage(160, 120))
    }
}
