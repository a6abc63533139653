package org.edgevit.demo.core

/** Average of the last [window] values added (all of them until [window] are in). */
class MovingAverage(val window: Int) {
    init {
        require(window >= 1) { "window must be at least 1, got $window" }
    }

    private val values = DoubleArray(window)
    private var next = 0

    /** How many values the average is over (at most [window]). */
    var count = 0
        private set

    fun add(value: Double) {
        values[next] = value
        next = (next + 1) % window
        if (count < window) count++
    }

    /** The average, or NaN before the first value. Summed afresh each time: no drift. */
    val average: Double
        get() {
            if (count == 0) return Double.NaN
            var sum = 0.0
            for (k in 0 until count) sum += values[k]
            return sum / count
        }

    fun clear() {
        next = 0
        count = 0
    }
}
