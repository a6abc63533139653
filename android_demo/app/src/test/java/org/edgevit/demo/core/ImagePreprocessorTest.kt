package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Test
import java.nio.ByteBuffer
import java.nio.ByteOrder

class ImagePreprocessorTest {
    private fun pre(input: Int, resize: Int, mean: Float = 0f, std: Float = 1f) = Preprocessing(
        input, resize, Interpolation.BILINEAR, List(3) { mean }, List(3) { std }, listOf(0f, 1f),
    )

    private fun tensor(size: Int, type: TensorType, q: Quantization? = null) =
        TensorInfo(listOf(1, size, size, 3), type, q)

    @Test
    fun geometryResizesShorterSideAndCentersCrop() {
        val p = ImagePreprocessor(pre(256, 288), tensor(256, TensorType.FLOAT32))
        assertEquals(ImagePreprocessor.Geometry(384, 288, 64, 16), p.geometry(640, 480))
        assertEquals(ImagePreprocessor.Geometry(288, 512, 16, 128), p.geometry(1080, 1920))
        // Never smaller than the input size.
        val q = ImagePreprocessor(pre(16, 16), tensor(16, TensorType.FLOAT32))
        assertEquals(ImagePreprocessor.Geometry(16, 16, 0, 0), q.geometry(16, 16))
    }

    @Test
    fun geometryRoundsHalvesToEvenLikePython() {
        val p = ImagePreprocessor(pre(16, 18), tensor(16, TensorType.FLOAT32))
        assertEquals(22, p.geometry(4, 5).resizedHeight) // 22.5 -> 22
        assertEquals(18, p.geometry(4, 4).resizedHeight)
        assertEquals(ImagePreprocessor.Geometry(18, 27, 1, 5), p.geometry(2, 3)) // 27.0
    }

    @Test
    fun uniformImageStaysUniformThroughResize() {
        val p = ImagePreprocessor(pre(8, 9), tensor(8, TensorType.FLOAT32))
        val grey = IntArray(40 * 30) { (0xFF shl 24) or (100 shl 16) or (150 shl 8) or 200 }
        val out = p.resizeAndCrop(grey, 40, 30)
        assertEquals(64, out.size)
        for (px in out) assertEquals(grey[0], px)
    }

    @Test
    fun aDetectorIsFedTheWholeFrameResizedToTheSquareAsMediaPipeResizesIt() {
        val (w, h) = 40 to 24
        val frame = IntArray(w * h) { (0xFF shl 24) or ((it % w * 6) shl 16) or ((it / w * 10) shl 8) or (it * 7 % 256) }
        val whole = MediaPipeResize.resize(frame, w, h, 8)
        for (filter in Interpolation.values()) {
            val p = Preprocessing(8, 9, filter, List(3) { 0f }, List(3) { 1f }, listOf(0f, 1f))
            val detector = ImagePreprocessor(p, tensor(8, TensorType.FLOAT32), wholeImage = true)
            assertEquals(ImagePreprocessor.Geometry(8, 8, 0, 0), detector.geometry(w, h))
            // whichever filter the metadata names, as edgevit eval resizes a detector's photo
            assertArrayEquals(whole, detector.resizeAndCrop(frame, w, h))
            assertFalse(whole.contentEquals(PilResize.resize(frame, w, h, 8, 8, filter)))
            // not what a classifier gets: the centre crop of the shorter-side resize
            val cropped = ImagePreprocessor(p, tensor(8, TensorType.FLOAT32)).resizeAndCrop(frame, w, h)
            assertFalse(whole.contentEquals(cropped))
        }
    }

    @Test
    fun aDetectorsBoxMapsOntoTheWholeFrame() {
        val detector = ImagePreprocessor(pre(8, 9), tensor(8, TensorType.FLOAT32), wholeImage = true)
        val frame = detector.cropInImage(640, 480)
        assertEquals(ImagePreprocessor.Crop(0, 0, 640, 480), frame)
        // (top, left, bottom, right) normalised to the input: a quarter in from each side of the frame
        assertEquals(120f, frame.y(0.25f), 0f)
        assertEquals(160f, frame.x(0.25f), 0f)
        assertEquals(360f, frame.y(0.75f), 0f)
        assertEquals(480f, frame.x(0.75f), 0f)
        // a classifier's crop is the centre square: the same box lands inside it
        val centre = ImagePreprocessor(pre(8, 9), tensor(8, TensorType.FLOAT32)).cropInImage(640, 480)
        assertEquals(ImagePreprocessor.Crop(107, 0, 427, 427), centre)
        assertEquals(107f + 0.25f * 427, centre.x(0.25f), 0f)
    }

    @Test
    fun normalizeIsChannelwiseFloat32() {
        val p = ImagePreprocessor(
            Preprocessing(1, 1, Interpolation.BILINEAR, listOf(0.5f, 0.25f, 0f), listOf(0.5f, 0.25f, 2f), listOf()),
            tensor(1, TensorType.FLOAT32),
        )
        val v = p.normalize(intArrayOf((0xFF shl 24) or (255 shl 16) or (0 shl 8) or 51))
        assertArrayEquals(floatArrayOf(1f, -1f, (51f / 255f) / 2f), v, 0f)
    }

    @Test
    fun aFileThatNormalisesItselfGetsTheCameraBytesOrPixelsOverTwoFiftyFive() {
        val pixel = intArrayOf((0xFF shl 24) or (255 shl 16) or (7 shl 8) or 128)
        val imagenet = listOf(0.485f, 0.456f, 0.406f) to listOf(0.229f, 0.224f, 0.225f)
        for (q in listOf(Quantization(1f, 0), Quantization(1f / 255f, 0))) {
            val bytes = Preprocessing(1, 1, Interpolation.BILINEAR, imagenet.first, imagenet.second, listOf(),
                InputKind.RGB_BYTES)
            val p = ImagePreprocessor(bytes, tensor(1, TensorType.UINT8, q))
            val out = ByteBuffer.allocate(3)
            p.write(p.normalize(pixel), out)
            assertArrayEquals(byteArrayOf(255.toByte(), 7, 128.toByte()), out.array())
        }
        val unit = Preprocessing(1, 1, Interpolation.BILINEAR, imagenet.first, imagenet.second, listOf(),
            InputKind.RGB_UNIT)
        val v = ImagePreprocessor(unit, tensor(1, TensorType.FLOAT32)).normalize(pixel)
        assertArrayEquals(floatArrayOf(1f, 7f / 255f, 128f / 255f), v, 0f)
    }

    @Test
    fun quantizeRoundsHalfToEvenAndClamps() {
        val q = Quantization(0.5f, -1)
        val bytes = Quantizer.quantize(floatArrayOf(0.25f, 0.75f, -0.25f, 1000f, -1000f), TensorType.INT8, q)
        // 0.5 -> 0, 1.5 -> 2, -0.5 -> -0: then + zero point -1
        assertArrayEquals(byteArrayOf(-1, 1, -1, 127, -128), bytes)
        val u = Quantizer.quantize(floatArrayOf(0f, 127.5f, 300f, -3f), TensorType.UINT8, Quantization(1f, 0))
        assertArrayEquals(byteArrayOf(0, 128.toByte(), 255.toByte(), 0), u)
    }

    @Test
    fun processWritesFloatInputInBufferOrder() {
        val p = ImagePreprocessor(pre(1, 1), tensor(1, TensorType.FLOAT32))
        val buffer = p.newInputBuffer()
        assertEquals(ByteOrder.nativeOrder(), buffer.order())
        p.process(intArrayOf((0xFF shl 24) or (255 shl 16)), 1, 1, buffer)
        buffer.rewind()
        assertEquals(1f, buffer.getFloat(), 0f)
        assertEquals(0f, buffer.getFloat(), 0f)
    }

    @Test
    fun processWritesQuantizedBytes() {
        val p = ImagePreprocessor(pre(1, 1), tensor(1, TensorType.UINT8, Quantization(1f / 255f, 0)))
        val buffer = ByteBuffer.allocate(3)
        p.process(intArrayOf((0xFF shl 24) or (255 shl 16) or (128 shl 8) or 1), 1, 1, buffer)
        assertArrayEquals(byteArrayOf(255.toByte(), 128.toByte(), 1), buffer.array())
    }

    @Test(expected = IllegalArgumentException::class)
    fun tooSmallBufferIsRefused() {
        val p = ImagePreprocessor(pre(2, 2), tensor(2, TensorType.INT8, Quantization(1f, 0)))
        p.process(IntArray(4), 2, 2, ByteBuffer.allocate(3))
    }
}
