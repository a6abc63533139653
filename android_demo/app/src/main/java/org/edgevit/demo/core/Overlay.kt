package org.edgevit.demo.core

/** A rectangle of a frame, in its pixels. */
data class FrameRegion(val left: Int, val top: Int, val width: Int, val height: Int) {
    init {
        require(width > 0 && height > 0) { "empty region $width x $height" }
    }

    companion object {
        /**
         * [left], [top], [right], [bottom] (a `Rect`: right and bottom exclusive) of a [width] x [height]
         * buffer, in the upright frame [Rotation.rotate] makes of it by turning it [degrees] clockwise.
         */
        fun upright(left: Int, top: Int, right: Int, bottom: Int, width: Int, height: Int, degrees: Int): FrameRegion =
            when (((degrees % 360) + 360) % 360) {
                0 -> FrameRegion(left, top, right - left, bottom - top)
                90 -> FrameRegion(height - bottom, left, bottom - top, right - left) // (x, y) -> (h - 1 - y, x)
                180 -> FrameRegion(width - right, height - bottom, right - left, bottom - top)
                270 -> FrameRegion(top, width - right, bottom - top, right - left) // (x, y) -> (y, w - 1 - x)
                else -> throw IllegalArgumentException("rotation must be a multiple of 90 degrees, got $degrees")
            }
    }
}

/**
 * Where a frame-sized overlay lands in a view: view = frame * [scale] + ([dx], [dy]), as an `ImageView`
 * matrix. The overlay is drawn in the frame's pixels (the mask over the model's crop, boxes over the
 * frame); this places it over what the view shows of that frame.
 */
data class Placement(val scale: Float, val dx: Float, val dy: Float) {
    companion object {
        /**
         * [visible] filling a [viewWidth] x [viewHeight] view as PreviewView's `FILL_CENTER` fills it: scaled
         * to cover the view, centred. For the camera, [visible] is the analysis frame's crop rect for the
         * preview's viewport (CameraX gives every use case of a `UseCaseGroup` the same field of view), which
         * is what the preview shows even when its stream's aspect ratio is not the analysis frame's.
         */
        fun fillCenter(visible: FrameRegion, viewWidth: Int, viewHeight: Int): Placement {
            val scale = maxOf(viewWidth.toFloat() / visible.width, viewHeight.toFloat() / visible.height)
            return Placement(
                scale,
                viewWidth / 2f - (visible.left + visible.width / 2f) * scale,
                viewHeight / 2f - (visible.top + visible.height / 2f) * scale,
            )
        }

        /** A [width] x [height] image fitted whole into the view, centred: `ImageView`'s `fitCenter` (a gallery photo). */
        fun fitCenter(width: Int, height: Int, viewWidth: Int, viewHeight: Int): Placement {
            val scale = minOf(viewWidth.toFloat() / width, viewHeight.toFloat() / height)
            return Placement(scale, (viewWidth - width * scale) / 2f, (viewHeight - height * scale) / 2f)
        }
    }
}
