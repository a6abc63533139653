package org.edgevit.demo.core

/**
 * Three overlay buffers passed between the worker, which draws the next result, and the UI thread,
 * which shows one, with one owner per buffer at any time: the one shown is the UI's, the one handed
 * over and not shown yet is nobody's to draw on, and the third is the worker's ([drawable]). With two,
 * a worker that finished a second frame before the UI showed the first would have to draw on the one
 * about to be shown. A result handed over while the previous one still waits replaces it, and the
 * replaced one goes back to the worker: the UI skips it ([take] says false) and shows the newer one.
 */
class BufferHandOver<T : Any>(first: T, second: T, third: T) {
    private val buffers = listOf(first, second, third)
    private val lock = Any()
    private var drawing = 0
    private var waiting = NONE
    private var shown = NONE

    /** The worker's buffer: neither shown nor waiting to be; the same one until [handOver]. */
    fun drawable(): T = synchronized(lock) { buffers[drawing] }

    /** The worker is done with [drawable]'s buffer, which now waits for [take]; returns it. */
    fun handOver(): T = synchronized(lock) {
        val handed = drawing
        // The one still waiting, never shown, or else the one neither shown nor handed over.
        drawing = if (waiting != NONE) waiting else buffers.indices.first { it != handed && it != shown }
        waiting = handed
        buffers[handed]
    }

    /**
     * The UI thread takes [buffer] to show if it is the one waiting (true), and gives the one it
     * showed before back to the worker; false when a newer result replaced it (show nothing of it).
     */
    fun take(buffer: T): Boolean = synchronized(lock) {
        if (waiting == NONE || buffers[waiting] !== buffer) return false
        shown = waiting
        waiting = NONE
        true
    }

    private companion object {
        const val NONE = -1
    }
}
