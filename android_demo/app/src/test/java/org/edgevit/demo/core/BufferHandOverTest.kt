package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertNotSame
import org.junit.Assert.assertSame
import org.junit.Assert.assertTrue
import org.junit.Test
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit
import kotlin.concurrent.thread

class BufferHandOverTest {
    @Test
    fun theWorkerNeverDrawsOnTheBufferShownOrWaiting() {
        val a = IntArray(1)
        val b = IntArray(1)
        val c = IntArray(1)
        val buffers = BufferHandOver(a, b, c)
        val first = buffers.drawable()
        assertSame(first, buffers.handOver())
        assertTrue(buffers.take(first)) // shown
        val second = buffers.handOver() // waiting: the UI has not taken it yet
        val third = buffers.drawable()
        assertNotSame(first, third)
        assertNotSame(second, third)
        assertTrue(buffers.take(second)) // shown; first goes back to the worker
        assertSame(third, buffers.handOver())
        assertSame(first, buffers.drawable())
    }

    @Test
    fun aResultHandedOverBeforeTheLastWasShownReplacesIt() {
        val buffers = BufferHandOver(IntArray(1), IntArray(1), IntArray(1))
        assertTrue(buffers.take(buffers.handOver()))
        val older = buffers.handOver()
        val newer = buffers.handOver() // the UI thread was slow: older was never shown
        assertSame(older, buffers.drawable()) // and is the worker's again
        assertFalse(buffers.take(older))
        assertTrue(buffers.take(newer))
        assertFalse(buffers.take(newer)) // once
    }

    @Test
    fun aBufferIsNeverWrittenWhileTheUiThreadShowsIt() {
        // The worker fills its buffer with the frame number; the "UI thread" checks that the buffer it shows
        // still holds one number throughout, until it shows the next.
        val buffers = BufferHandOver(IntArray(4096), IntArray(4096), IntArray(4096))
        val posted = LinkedBlockingQueue<IntArray>()
        val frames = 5000
        val worker = thread {
            for (frame in 1..frames) {
                buffers.drawable().fill(frame)
                posted.put(buffers.handOver())
            }
        }
        var shownFrames = 0
        var torn = 0
        var last = 0
        while (true) {
            val buffer = posted.poll(100, TimeUnit.MILLISECONDS)
                ?: if (worker.isAlive || posted.isNotEmpty()) continue else break
            if (!buffers.take(buffer)) continue
            val value = buffer[0]
            repeat(3) { for (v in buffer) if (v != value) torn++ }
            assertTrue(value > last)
            last = value
            shownFrames++
        }
        worker.join()
        assertEquals(0, torn)
        assertEquals(frames, last) // the newest result is always shown in the end
        assertTrue(shownFrames > 0)
    }
}
