package org.edgevit.demo

import android.content.Context
import android.graphics.Bitmap
import android.text.SpannableStringBuilder
import android.text.Spanned
import android.text.style.ForegroundColorSpan
import android.view.View
import org.edgevit.demo.core.ClassColors
import org.edgevit.demo.core.ImagePreprocessor
import org.edgevit.demo.core.Legend
import org.edgevit.demo.core.MaskUpsampler
import org.edgevit.demo.core.ModelMetadata
import org.edgevit.demo.core.Pixels
import java.nio.ByteBuffer

/**
 * A segmenter's logits `[1, h, w, classes]` as a category mask over the frame: dequantized,
 * upsampled bilinearly to the part of the frame the model saw and argmaxed ([MaskUpsampler], as
 * `edgevit eval` does), each class in its colour ([ClassColors]) on a frame-sized
 * overlay (transparent outside the crop), with a legend of the classes present and their share.
 * The overlay's opacity is the view's alpha, set by the activity: no repaint to change it.
 */
class SegmenterTask(
    private val context: Context,
    private val metadata: ModelMetadata,
    private val labels: List<String>,
) : VisionTask {
    private val preprocessor = ImagePreprocessor(metadata)
    private val logits = FloatArray(metadata.output.elementCount)
    private val colors = ClassColors.forLabels(labels)
    private val legend = Legend(labels, colors)

    // Sized for the frame; made again only when the frame size changes.
    private var crop = ImagePreprocessor.Crop(0, 0, 0, 0)
    private var frameWidth = 0
    private var frameHeight = 0
    private var upsampler: MaskUpsampler? = null
    private var mask = ByteArray(0)
    private var painted = IntArray(0)

    // The worker paints the one the UI thread does not show ([shown], set when it shows one).
    private val bitmaps = arrayOfNulls<Bitmap>(2)
    @Volatile private var shown = 0

    override fun attach(views: ResultViews) {
        views.overlay.setImageBitmap(null)
        views.overlay.visibility = View.VISIBLE
        views.overlayControls.visibility = View.VISIBLE
    }

    override fun interpret(outputs: List<ByteBuffer>, frame: Pixels): VisionTask.Shown {
        val upsampler = sizedFor(frame.width, frame.height)
        MaskUpsampler.readLogits(outputs[0], metadata.output, logits)
        upsampler.classify(logits, mask)
        for (y in 0 until crop.height) {
            val row = (crop.top + y) * frame.width + crop.left
            val maskRow = y * crop.width
            for (x in 0 until crop.width) painted[row + x] = colors[mask[maskRow + x].toInt() and 0xFF]
        }
        val index = 1 - shown
        val bitmap = bitmaps[index]!!
        bitmap.setPixels(painted, 0, frame.width, 0, 0, frame.width, frame.height)
        val text = legendText(crop.width * crop.height)
        return VisionTask.Shown { views ->
            views.overlay.setImageBitmap(bitmap)
            shown = index
            views.results.text = text
        }
    }

    private fun sizedFor(width: Int, height: Int): MaskUpsampler {
        val current = upsampler
        if (current != null && width == frameWidth && height == frameHeight) return current
        val shape = metadata.output.shape
        crop = preprocessor.cropInImage(width, height)
        frameWidth = width
        frameHeight = height
        mask = ByteArray(crop.width * crop.height)
        painted = IntArray(width * height) // transparent outside the crop
        for (i in bitmaps.indices) bitmaps[i] = Bitmap.createBitmap(width, height, Bitmap.Config.ARGB_8888)
        return MaskUpsampler(shape[1], shape[2], shape[3], crop.height, crop.width).also { upsampler = it }
    }

    /** The classes present, largest first, each after a swatch of its colour (an outline when transparent). */
    private fun legendText(pixels: Int): CharSequence {
        val text = SpannableStringBuilder()
        for ((i, entry) in legend.of(mask, pixels).take(LEGEND_LINES).withIndex()) {
            if (i > 0) text.append("\n")
            val start = text.length
            text.append(if (entry.color == ClassColors.TRANSPARENT) "□" else "■")
            if (entry.color != ClassColors.TRANSPARENT) {
                text.setSpan(ForegroundColorSpan(entry.color), start, text.length, Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
            }
            text.append(" ").append(context.getString(R.string.result_line, 100f * entry.share, entry.label))
        }
        return text
    }

    companion object {
        /** As many as the classifier's top classes: the results view's height. */
        const val LEGEND_LINES = ClassifierTask.TOP_K
    }
}
