package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertTrue
import org.junit.Test
import kotlin.random.Random

class SegmentationTest {
    /** Every class interpolated at every pixel, in the same float32 steps: what pruning must reproduce. */
    private fun everyClass(logits: FloatArray, h: Int, w: Int, classes: Int, height: Int, width: Int): ByteArray {
        fun place(source: Int, target: Int, i: Int): Triple<Int, Int, Float> {
            val at = i.toFloat() * ((source - 1).toFloat() / maxOf(target - 1, 1).toFloat())
            val low = maxOf(kotlin.math.floor(at), 0f).toInt()
            return Triple(low, minOf(kotlin.math.ceil(at).toInt(), source - 1), (at - low).coerceIn(0f, 1f))
        }
        return ByteArray(height * width) { p ->
            val (y0, y1, ty) = place(h, height, p / width)
            val (x0, x1, tx) = place(w, width, p % width)
            fun row(x: Int, c: Int): Float {
                val a = logits[(y0 * w + x) * classes + c]
                return a + (logits[(y1 * w + x) * classes + c] - a) * ty
            }
            val values = FloatArray(classes) { c -> row(x0, c) + (row(x1, c) - row(x0, c)) * tx }
            values.indices.maxByOrNull { values[it] }!!.toByte()
        }
    }

    @Test
    fun keepingOnlyTheClassesThatCanWinGivesTheMaskOfEveryClass() {
        val random = Random(7)
        for ((h, w, classes) in listOf(Triple(8, 8, 21), Triple(5, 7, 3), Triple(1, 4, 150))) {
            // Smooth maps (each class a plane plus noise, some classes equal): near-ties at every boundary.
            val logits = FloatArray(h * w * classes) { i ->
                val c = i % classes
                val x = (i / classes) % w
                val y = i / classes / w
                if (c % 5 == 4) 0f else (c % 3 - 1) * (x - y) * 0.7f + random.nextFloat() * 2f
            }
            val mask = ByteArray(37 * 53)
            MaskUpsampler(h, w, classes, 37, 53).classify(logits, mask)
            assertArrayEquals(everyClass(logits, h, w, classes, 37, 53), mask)
        }
    }

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
        val legend = Legend(List(200) { "c$it" }, IntArray(200), 5)
        assertTrue(legend.update(mask, 1))
        assertEquals(listOf(LegendEntry(199, "c199", 0, 1f, 100)), legend.entries())
    }

    @Test
    fun theLegendChangesOnlyWhenWhatItListsChanges() {
        val legend = Legend(listOf("background", "cat", "dog", "person"), IntArray(4), 2)
        fun mask(vararg counts: Int) = ByteArray(counts.sum()).also { m ->
            var at = 0
            for ((c, n) in counts.withIndex()) repeat(n) { m[at++] = c.toByte() }
        }
        assertTrue(legend.update(mask(500, 300, 0, 200), 1000))
        assertEquals(listOf(0 to 50, 1 to 30), legend.entries().map { it.index to it.percent })
        assertFalse(legend.update(mask(500, 300, 0, 200), 1000)) // the same frame again
        assertFalse(legend.update(mask(502, 298, 0, 200), 1000)) // shares move under half a percent
        assertTrue(legend.update(mask(520, 280, 0, 200), 1000)) // 52% and 28%
        assertTrue(legend.update(mask(500, 200, 0, 300), 1000)) // person overtakes cat
        assertEquals(listOf(0 to 50, 3 to 30), legend.entries().map { it.index to it.percent })
        assertFalse(legend.update(mask(500, 200, 0, 300), 1000))
        assertTrue(legend.update(mask(1000), 1000)) // one class left: a line fewer
        assertEquals(listOf(LegendEntry(0, "background", 0, 1f, 100)), legend.entries())
        assertTrue(legend.update(mask(0, 300, 300, 400), 1000)) // a tie: the lower class first
        assertEquals(listOf(3 to 40, 1 to 30), legend.entries().map { it.index to it.percent })
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
