package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test

class MovingAverageTest {
    @Test
    fun averagesTheLastWindowValues() {
        val m = MovingAverage(3)
        assertTrue(m.average.isNaN())
        m.add(3.0)
        assertEquals(3.0, m.average, 0.0)
        m.add(6.0)
        assertEquals(4.5, m.average, 0.0)
        m.add(9.0)
        m.add(12.0) // drops 3
        assertEquals(9.0, m.average, 1e-12)
        assertEquals(3, m.count)
        m.clear()
        assertEquals(0, m.count)
        assertTrue(m.average.isNaN())
    }

    @Test(expected = IllegalArgumentException::class)
    fun windowMustBePositive() {
        MovingAverage(0)
    }
}
