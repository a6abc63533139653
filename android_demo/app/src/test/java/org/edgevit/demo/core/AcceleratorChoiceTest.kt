package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertNull
import org.junit.Test

class AcceleratorChoiceTest {
    @Test
    fun supportedAcceleratorIsUsed() {
        val opened = AcceleratorChoice.open(Accelerator.GPU, { null }) { "model on $it" }
        assertEquals(Opened("model on GPU", Accelerator.GPU, Accelerator.GPU, null), opened)
    }

    @Test
    fun failedCompatibilityCheckFallsBackToCpuWithItsReason() {
        val tried = mutableListOf<Accelerator>()
        val opened = AcceleratorChoice.open(Accelerator.NNAPI, { "NNAPI needs Android 8.1" }) { tried += it; it }
        assertEquals(listOf(Accelerator.CPU), tried)
        assertEquals(Accelerator.CPU, opened.active)
        assertEquals(Accelerator.NNAPI, opened.requested)
        assertEquals("NNAPI needs Android 8.1", opened.fallbackReason)
    }

    @Test
    fun delegateErrorFallsBackToCpuWithTheFirstLineOfTheError() {
        val opened = AcceleratorChoice.open(Accelerator.GPU, { null }) {
            if (it == Accelerator.GPU) throw IllegalArgumentException("Internal error: Failed to apply delegate\ndetails")
            "cpu model"
        }
        assertEquals("cpu model", opened.value)
        assertEquals("Internal error: Failed to apply delegate", opened.fallbackReason)
    }

    @Test
    fun cpuIsOpenedDirectly() {
        val opened = AcceleratorChoice.open(Accelerator.CPU, { error("not asked for CPU") }) { 1 }
        assertNull(opened.fallbackReason)
    }

    @Test(expected = IllegalStateException::class)
    fun cpuFailurePropagates() {
        AcceleratorChoice.open(Accelerator.GPU, { "no GPU" }) { throw IllegalStateException("bad model") }
    }

    @Test
    fun threadChoicesArePowersOfTwoAndTheCoreCount() {
        assertEquals(listOf(1, 2, 4, 6), AcceleratorChoice.threadChoices(6))
        assertEquals(listOf(1, 2, 4, 8), AcceleratorChoice.threadChoices(8))
        assertEquals(listOf(1), AcceleratorChoice.threadChoices(0))
    }

    @Test
    fun describeFallsBackToTheClassName() {
        assertEquals("IllegalStateException", AcceleratorChoice.describe(IllegalStateException()))
    }
}
