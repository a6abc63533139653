package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertNotEquals
import org.junit.Assert.assertNull
import org.junit.Assert.assertThrows
import org.junit.Assert.assertTrue
import org.junit.Test
import java.nio.ByteBuffer
import java.nio.ByteOrder

class GpuCheckTest {
    private val verdicts = GpuVerdicts()

    private fun floatOutput(vararg values: Float): ByteBuffer {
        val buffer = ByteBuffer.allocate(4 * values.size).order(ByteOrder.nativeOrder())
        values.forEach { buffer.putFloat(it) }
        buffer.rewind()
        return buffer
    }

    private fun floatTensor(size: Int) = TensorInfo(listOf(1, size), TensorType.FLOAT32, null)

    /** A model opened on the GPU with nothing remembered about it, its first frame about to be checked. */
    private fun checkOnGpu(modelKey: String = "model-a"): GpuCheck {
        val (opened, check) = GpuCheck.open(Accelerator.GPU, modelKey, verdicts, { null }) { it }
        assertEquals(Accelerator.GPU, opened)
        assertEquals(GpuCheckState.UNVERIFIED, check.state)
        return check
    }

    private fun compareFloats(check: GpuCheck, gpu: FloatArray, cpu: FloatArray): OutputAgreement {
        check.begin()
        assertEquals(GpuCheckState.VERIFYING, check.state)
        return check.finish(floatOutput(*gpu), floatOutput(*cpu), floatTensor(gpu.size))
    }

    @Test
    fun agreeingOutputsKeepTheGpuAndSaySoOnce() {
        val check = checkOnGpu()
        assertEquals(Notice("Checking GPU results against CPU on the first frame…", isWarning = false), check.notice)
        val agreement = compareFloats(check, floatArrayOf(100f, 1f), floatArrayOf(100f, 0f))
        assertTrue(agreement.agrees)
        assertEquals(GpuCheckState.VERIFIED, check.state)
        assertEquals(Accelerator.GPU, check.active)
        assertEquals(Notice("GPU verified against CPU (cosine 0.99995)", isWarning = false), check.notice)

        val (_, reloaded) = GpuCheck.open(Accelerator.GPU, "model-a", verdicts, { null }) { it }
        assertEquals(GpuCheckState.VERIFIED, reloaded.state)
        assertEquals(Accelerator.GPU, reloaded.active)
        assertNull("agreement was already said", reloaded.notice)
    }

    @Test
    fun disagreeingOutputsMoveTheModelToTheCpuWithAWarning() {
        val check = checkOnGpu()
        val agreement = compareFloats(check, floatArrayOf(3f, 4f), floatArrayOf(4f, 3f))
        assertEquals(0.96, agreement.cosine, 1e-12)
        assertFalse(agreement.agrees)
        assertEquals(GpuCheckState.REJECTED, check.state)
        assertEquals(Accelerator.CPU, check.active)
        assertEquals(Accelerator.GPU, check.requested)
        assertEquals(Notice("GPU results differ from CPU (cosine 0.96): using CPU", isWarning = true), check.notice)
    }

    @Test
    fun theVerdictIsRememberedPerModelFile() {
        compareFloats(checkOnGpu("model-a"), floatArrayOf(3f, 4f), floatArrayOf(4f, 3f))

        val tried = mutableListOf<Accelerator>()
        val (_, again) = GpuCheck.open(Accelerator.GPU, "model-a", verdicts, { null }) { tried += it }
        assertEquals("a rejected GPU is not opened again", listOf(Accelerator.CPU), tried)
        assertEquals(GpuCheckState.REJECTED, again.state)
        assertEquals(Accelerator.CPU, again.active)
        assertEquals(
            Notice("GPU results differed from CPU on an earlier check (cosine 0.96): using CPU", isWarning = true),
            again.notice,
        )

        checkOnGpu("model-b")
        val (_, onCpu) = GpuCheck.open(Accelerator.CPU, "model-a", verdicts, { null }) { it }
        assertEquals(GpuCheckState.NOT_NEEDED, onCpu.state)
        assertNull(onCpu.notice)
    }

    @Test
    fun int8OutputsAreDequantizedBeforeComparing() {
        // Around a zero point of 128 the raw bytes look alike (all near 128); the values are opposite.
        val tensor = TensorInfo(listOf(1, 4), TensorType.UINT8, Quantization(0.5f, 128))
        val gpuRaw = byteArrayOf(129.toByte(), 127, 129.toByte(), 127)
        val cpuRaw = byteArrayOf(127, 129.toByte(), 127, 129.toByte())
        assertTrue(OutputAgreement.of(unsigned(gpuRaw), unsigned(cpuRaw)).agrees)

        val check = checkOnGpu()
        check.begin()
        val agreement = check.finish(ByteBuffer.wrap(gpuRaw), ByteBuffer.wrap(cpuRaw), tensor)
        assertEquals(-1.0, agreement.cosine, 1e-12)
        assertEquals(GpuCheckState.REJECTED, check.state)

        val int8 = TensorInfo(listOf(1, 4), TensorType.INT8, Quantization(0.25f, -3))
        val close = checkOnGpu("int8-model")
        close.begin()
        val gpu = ByteBuffer.wrap(byteArrayOf(10, -20, 50, -3))
        assertTrue(close.finish(gpu, ByteBuffer.wrap(byteArrayOf(10, -20, 51, -3)), int8).agrees)
        assertEquals(GpuCheckState.VERIFIED, close.state)
    }

    @Test
    fun aDetectorAgreesOnlyWhenEveryOutputDoes() {
        val boxes = TensorInfo(listOf(1, 2, 4), TensorType.UINT8, Quantization(0.1f, 128))
        val scores = TensorInfo(listOf(1, 2, 2), TensorType.UINT8, Quantization(1f / 256, 0))
        val sameBoxes = byteArrayOf(120, -126, 100, -100, 1, 2, 3, 4)
        fun compare(gpuScores: ByteArray): GpuCheck {
            val check = checkOnGpu("detector-${gpuScores.toList()}")
            check.begin()
            check.finish(
                listOf(ByteBuffer.wrap(sameBoxes), ByteBuffer.wrap(gpuScores)),
                listOf(ByteBuffer.wrap(sameBoxes), ByteBuffer.wrap(byteArrayOf(-56, 10, 5, -76))),
                listOf(boxes, scores),
            )
            return check
        }
        assertEquals(GpuCheckState.VERIFIED, compare(byteArrayOf(-56, 10, 5, -77)).state)
        // the boxes agree exactly, the scores swap classes: the GPU is rejected on the scores
        val swapped = compare(byteArrayOf(10, -56, -76, 5))
        assertEquals(GpuCheckState.REJECTED, swapped.state)
        assertEquals(Accelerator.CPU, swapped.active)
    }

    private fun unsigned(raw: ByteArray) = FloatArray(raw.size) { (raw[it].toInt() and 0xFF).toFloat() }

    @Test
    fun nanOrInfInTheGpuOutputIsDisagreement() {
        for (bad in listOf(Float.NaN, Float.POSITIVE_INFINITY, Float.NEGATIVE_INFINITY)) {
            val check = checkOnGpu("model-$bad")
            val agreement = compareFloats(check, floatArrayOf(1f, bad, 2f), floatArrayOf(1f, 0.5f, 2f))
            assertFalse(agreement.agrees)
            assertEquals(Accelerator.CPU, check.active)
            assertEquals(
                Notice("GPU results differ from CPU (GPU output has NaN or Inf): using CPU", isWarning = true),
                check.notice,
            )
        }
        val cpuBroken = OutputAgreement.of(floatArrayOf(1f, 2f), floatArrayOf(Float.NaN, 2f))
        assertFalse(cpuBroken.agrees)
        assertEquals("CPU output has NaN or Inf", cpuBroken.detail)
    }

    @Test
    fun zeroVectorsAgreeOnlyWithEachOther() {
        val bothZero = OutputAgreement.of(floatArrayOf(0f, 0f, 0f), floatArrayOf(0f, -0f, 0f))
        assertTrue(bothZero.agrees)
        assertEquals("cosine 1.00", bothZero.detail)
        val gpuZero = OutputAgreement.of(floatArrayOf(0f, 0f), floatArrayOf(0f, 1e-3f))
        assertFalse(gpuZero.agrees)
        assertEquals("GPU output is all zeros", gpuZero.detail)
        assertEquals("CPU output is all zeros", OutputAgreement.of(floatArrayOf(2f, 0f), floatArrayOf(0f, 0f)).detail)
    }

    @Test
    fun thresholdAndShownCosineNeverContradictEachOther() {
        assertTrue(OutputAgreement(OutputAgreement.MIN_COSINE).agrees)
        val justBelow = OutputAgreement(0.98999999)
        assertFalse(justBelow.agrees)
        assertEquals("cosine 0.98999", justBelow.detail)
        assertEquals("0.99999", OutputAgreement.formatCosine(0.9999999))
        assertEquals("1.00", OutputAgreement.formatCosine(1.0))
        assertEquals("-0.50", OutputAgreement.formatCosine(-0.5))
        assertEquals(1.0, OutputAgreement.of(floatArrayOf(1e30f, 3e30f), floatArrayOf(1e30f, 3e30f)).cosine, 1e-12)
    }

    @Test
    fun aGpuDelegateThatFailsToInitialiseFallsBackToTheCpuWithTheReason() {
        val (opened, check) = GpuCheck.open(Accelerator.GPU, "model-a", verdicts, { null }) {
            if (it == Accelerator.GPU) throw IllegalArgumentException("Internal error: Failed to apply delegate\nmore")
            "cpu session"
        }
        assertEquals("cpu session", opened)
        assertEquals(GpuCheckState.NOT_NEEDED, check.state)
        assertEquals(Accelerator.CPU, check.active)
        assertEquals(
            Notice("GPU unavailable (Internal error: Failed to apply delegate): running on CPU", isWarning = true),
            check.notice,
        )
        assertNull("no output was compared: the next load tries the GPU again", verdicts["model-a"])
    }

    @Test
    fun stepsOutOfOrderAreRefused() {
        val (_, onCpu) = GpuCheck.open(Accelerator.CPU, "model-a", verdicts, { null }) { it }
        assertThrows(IllegalStateException::class.java) { onCpu.begin() }
        val check = checkOnGpu()
        val finish = { check.finish(floatOutput(1f), floatOutput(1f), floatTensor(1)) }
        assertThrows(IllegalStateException::class.java) { finish() }
        check.begin()
        assertThrows(IllegalStateException::class.java) { check.begin() }
        finish()
        assertThrows(IllegalStateException::class.java) { check.begin() }
    }

    @Test
    fun aModelFileIsKnownByItsContent() {
        val key = GpuVerdicts.modelKey(byteArrayOf(1, 2, 3))
        assertEquals(64, key.length)
        assertEquals(key, GpuVerdicts.modelKey(byteArrayOf(1, 2, 3)))
        assertNotEquals(key, GpuVerdicts.modelKey(byteArrayOf(1, 2, 4)))
    }
}
