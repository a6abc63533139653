package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder
import javax.imageio.ImageIO

/**
 * The app's preprocessing against edgevit's Python preprocessing, byte for
 * byte, on the cases of offline-check/make_golden.py: same PNG, same metadata
 * document, same resized pixels, float input bits and int8/uint8 bytes; and a
 * detector's frames resized as `edgevit eval` resizes them (MediaPipe's resize).
 *
 * Reads the cases from the folder named by the `edgevit.golden.dir` system
 * property (the pytest suite regenerates them there on each run), else from
 * the committed copy in src/test/resources/golden.
 */
class GoldenPreprocessingTest {
    private val dir: File = System.getProperty("edgevit.golden.dir")?.let(::File)
        ?: File(javaClass.getResource("/golden/cases.txt")!!.toURI()).parentFile

    private val cases: List<String> = File(dir, "cases.txt").readLines().filter { it.isNotBlank() }

    private fun pixels(name: String): Triple<IntArray, Int, Int> {
        val image = ImageIO.read(File(dir, "$name.png"))
        val w = image.width
        val h = image.height
        return Triple(image.getRGB(0, 0, w, h, null, 0, w), w, h)
    }

    @Test
    fun everyCaseIsPresent() {
        assertTrue("no golden cases in $dir", cases.size >= 5)
    }

    private fun rgbBytes(argb: IntArray): ByteArray {
        val rgb = ByteArray(argb.size * 3)
        for (i in argb.indices) {
            rgb[i * 3] = (argb[i] shr 16).toByte()
            rgb[i * 3 + 1] = (argb[i] shr 8).toByte()
            rgb[i * 3 + 2] = argb[i].toByte()
        }
        return rgb
    }

    @Test
    fun resizedAndCroppedPixelsMatchPillow() {
        for (name in cases) {
            val meta = ModelMetadata.parse(File(dir, "$name.float32.json").readText())
            val (argb, w, h) = pixels(name)
            val cropped = ImagePreprocessor(meta).resizeAndCrop(argb, w, h)
            assertArrayEquals("resized pixels of $name", File(dir, "$name.rgb").readBytes(), rgbBytes(cropped))
        }
    }

    @Test
    fun aDetectorsFramesAreResizedAsMediaPipeResizesThem() {
        val detector = ModelMetadata.parse(File(dir, "detect.json").readText())
        val frames = File(dir, "detector_frames.txt").readLines().filter { it.isNotBlank() }
        assertTrue("no detector frames in $dir", frames.size >= 3)
        for (name in frames) {
            val (argb, w, h) = pixels(name)
            val resized = ImagePreprocessor(detector).resizeAndCrop(argb, w, h)
            assertArrayEquals("$name as a detector is fed it", File(dir, "$name.detector.rgb").readBytes(), rgbBytes(resized))
        }
    }

    @Test
    fun modelInputBytesMatchPythonForEveryInputType() {
        for (name in cases) {
            for (dtype in listOf("float32", "int8", "uint8")) {
                val meta = ModelMetadata.parse(File(dir, "$name.$dtype.json").readText())
                assertEquals(dtype, meta.input.type.jsonName)
                val pre = ImagePreprocessor(meta)
                val (argb, w, h) = pixels(name)
                // Python writes little-endian; compare in that order whatever the host's.
                val out = ByteBuffer.allocate(meta.input.byteSize).order(ByteOrder.LITTLE_ENDIAN)
                pre.process(argb, w, h, out)
                assertEquals(0, out.remaining())
                assertArrayEquals("$dtype input of $name", File(dir, "$name.$dtype.bin").readBytes(), out.array())
            }
        }
    }
}
