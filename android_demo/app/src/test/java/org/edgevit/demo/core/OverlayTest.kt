package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Test

class OverlayTest {
    /** A frame pixel position lands at (viewX, viewY) under the placement's matrix. */
    private fun assertLandsAt(placement: Placement, frameX: Float, frameY: Float, viewX: Float, viewY: Float) {
        assertEquals(viewX, frameX * placement.scale + placement.dx, 1e-3f)
        assertEquals(viewY, frameY * placement.scale + placement.dy, 1e-3f)
    }

    @Test
    fun aFourByThreeFrameOnATwentyByNinePhoneScreen() {
        // A 640x480 analysis buffer turned upright (90 degrees): 480x640. The 1080x2400 portrait view's
        // viewport (9:20) gives it the crop rect (0, 96)-(640, 384) in the buffer: the middle 288 columns upright.
        val visible = FrameRegion.upright(0, 96, 640, 384, 640, 480, 90)
        assertEquals(FrameRegion(96, 0, 288, 640), visible)
        val placement = Placement.fillCenter(visible, 1080, 2400)
        assertEquals(3.75f, placement.scale, 1e-6f)
        assertLandsAt(placement, 96f, 0f, 0f, 0f) // the visible part's corners on the view's
        assertLandsAt(placement, 384f, 640f, 1080f, 2400f)
        assertLandsAt(placement, 240f, 320f, 540f, 1200f) // centre on centre
        assertLandsAt(placement, 0f, 0f, -360f, 0f) // the frame's sides are off screen
    }

    @Test
    fun aPreviewStreamOfAnotherAspectRatioShowsLessThanTheAnalysisFrame() {
        // A 4:3 landscape tablet view (2000x1500) over a 16:9 preview stream: CameraX's viewport is the 4:3
        // part of what both streams see, (80, 60)-(560, 420) of the 640x480 analysis buffer. Centre-cropping
        // the whole analysis frame to the view (the overlay as it was) would have put x = 80 at the view's left
        // edge 250 pixels in, and scaled it by 3.125 instead of 4.1667.
        val visible = FrameRegion.upright(80, 60, 560, 420, 640, 480, 0)
        val placement = Placement.fillCenter(visible, 2000, 1500)
        assertEquals(2000f / 480f, placement.scale, 1e-5f)
        assertLandsAt(placement, 80f, 60f, 0f, 0f)
        assertLandsAt(placement, 560f, 420f, 2000f, 1500f)
        val wholeFrame = Placement.fillCenter(FrameRegion(0, 0, 640, 480), 2000, 1500)
        assertLandsAt(wholeFrame, 80f, 60f, 250f, 187.5f)
    }

    @Test
    fun aGalleryImageIsFittedWholeAndCentred() {
        val placement = Placement.fitCenter(4000, 3000, 1080, 2400)
        assertEquals(0.27f, placement.scale, 1e-6f)
        assertLandsAt(placement, 0f, 0f, 0f, 795f)
        assertLandsAt(placement, 4000f, 3000f, 1080f, 1605f)
    }

    @Test
    fun cropRectsTurnWithTheFrame() {
        // (10, 20)-(110, 70) of a 200x100 buffer, with each rotation Rotation.rotate applies to the pixels.
        assertEquals(FrameRegion(10, 20, 100, 50), FrameRegion.upright(10, 20, 110, 70, 200, 100, 0))
        assertEquals(FrameRegion(30, 10, 50, 100), FrameRegion.upright(10, 20, 110, 70, 200, 100, 90))
        assertEquals(FrameRegion(90, 30, 100, 50), FrameRegion.upright(10, 20, 110, 70, 200, 100, 180))
        assertEquals(FrameRegion(20, 90, 50, 100), FrameRegion.upright(10, 20, 110, 70, 200, 100, 270))
        // The pixel at the region's top-left corner lands where Rotation.rotate puts it.
        val argb = IntArray(200 * 100)
        argb[20 * 200 + 10] = 1
        for (degrees in intArrayOf(0, 90, 180, 270)) {
            val turned = Rotation.rotate(Pixels(argb, 200, 100), degrees)
            val r = FrameRegion.upright(10, 20, 11, 21, 200, 100, degrees)
            assertEquals("$degrees", 1, turned.argb[r.top * turned.width + r.left])
        }
    }
}
