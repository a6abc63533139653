package org.edgevit.demo.core

import org.junit.Assert.assertArrayEquals
import org.junit.Assert.assertEquals
import org.junit.Assert.assertSame
import org.junit.Test

class RotationTest {
    // 3 x 2 image:  1 2 3
    //               4 5 6
    private val image = Pixels(intArrayOf(1, 2, 3, 4, 5, 6), 3, 2)

    private fun check(degrees: Int, width: Int, height: Int, expected: IntArray) {
        val r = Rotation.rotate(image, degrees)
        assertEquals(width, r.width)
        assertEquals(height, r.height)
        assertArrayEquals(expected, r.argb.copyOf(width * height))
    }

    @Test
    fun rotatesClockwise() {
        check(90, 2, 3, intArrayOf(4, 1, 5, 2, 6, 3))
        check(180, 3, 2, intArrayOf(6, 5, 4, 3, 2, 1))
        check(270, 2, 3, intArrayOf(3, 6, 2, 5, 1, 4))
        check(-90, 2, 3, intArrayOf(3, 6, 2, 5, 1, 4))
        assertSame(image, Rotation.rotate(image, 360))
    }

    @Test
    fun fourQuarterTurnsAreTheIdentity() {
        var p = Pixels(IntArray(35) { it }, 7, 5)
        val buffer = IntArray(35)
        repeat(4) { p = Pixels(Rotation.rotate(p, 90).argb.copyOf(), p.height, p.width) }
        assertArrayEquals(IntArray(35) { it }, p.argb)
        assertSame(buffer, Rotation.rotate(p, 90, reuse = buffer).argb)
    }

    @Test(expected = IllegalArgumentException::class)
    fun onlyQuarterTurns() {
        Rotation.rotate(image, 45)
    }
}
