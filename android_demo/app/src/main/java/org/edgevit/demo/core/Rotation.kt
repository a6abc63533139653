package org.edgevit.demo.core

/** Packed ARGB pixels with their size. */
class Pixels(val argb: IntArray, val width: Int, val height: Int) {
    init {
        require(width > 0 && height > 0 && argb.size >= width * height) { "bad pixel buffer for $width x $height" }
    }
}

/**
 * Turn an image upright by a multiple of 90 degrees clockwise (CameraX's
 * `rotationDegrees`, EXIF orientation), on the pixel array: no Bitmap per
 * frame. The model must see the upright image, since resize and center-crop
 * depend on which side is the shorter one.
 */
object Rotation {
    fun rotate(src: Pixels, degrees: Int, reuse: IntArray? = null): Pixels {
        val d = ((degrees % 360) + 360) % 360
        require(d % 90 == 0) { "rotation must be a multiple of 90 degrees, got $degrees" }
        val w = src.width
        val h = src.height
        if (d == 0) return src
        val out = if (reuse != null && reuse.size == w * h) reuse else IntArray(w * h)
        val a = src.argb
        when (d) {
            90 -> { // (x, y) -> (h - 1 - y, x) in an h x w image
                for (y in 0 until h) for (x in 0 until w) out[x * h + (h - 1 - y)] = a[y * w + x]
                return Pixels(out, h, w)
            }
            180 -> {
                for (i in 0 until w * h) out[w * h - 1 - i] = a[i]
                return Pixels(out, w, h)
            }
            else -> { // 270: (x, y) -> (y, w - 1 - x)
                for (y in 0 until h) for (x in 0 until w) out[(w - 1 - x) * h + y] = a[y * w + x]
                return Pixels(out, h, w)
            }
        }
    }
}
