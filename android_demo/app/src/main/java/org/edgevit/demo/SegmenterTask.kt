package org.edgevit.demo

import android.content.Context
import android.graphics.Bitmap
import android.text.SpannableStringBuilder
import android.text.Spanned
import android.text.style.ForegroundColorSpan
import android.view.View
import org.edgevit.demo.core.BufferHandOver
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
 * overlay (transparent outside the crop), with a legend of the classes present and their share,
 * its text built again only when what it lists changes ([Legend.update]).
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
    private val legend = Legend(labels, colors, LEGEND_LINES)
    private var legendText: CharSequence = ""
    private var legendShown: CharSequence? = null // UI thread only

    // Sized for the frame; made again only when the frame size changes.
    private var crop = ImagePreprocessor.Crop(0, 0, 0, 0)
    private var frameWidth = 0
    private var frameHeight = 0
    private var upsampler: MaskUpsampler? = null
    private var mask = ByteArray(0)
    private var painted = IntArray(0)

    // The worker paints one, the UI thread shows another (see BufferHandOver).
    private var bitmaps: BufferHandOver<Bitmap>? = null

    override fun attach(views: ResultViews) {
        views.overlay.setImageBitmap(null)
        legendShown = null
        views.overlay.visibility = View.VISIBLE
        views.overlayControls.visibility = View.VISIBLE
    }

    override fun interpret(outputs: List<ByteBuffer>, frame: Pixels): VisionTask.Shown {
        val upsampler = sizedFor(frame.width, frame.height)
        val bitmaps = bitmaps!!
        MaskUpsampler.readLogits(outputs[0], metadata.output, logits)
        upsampler.classify(logits, mask)
        for (y in 0 until crop.height) {
            val row = (crop.top + y) * frame.width + crop.left
            val maskRow = y * crop.width
            for (x in 0 until crop.width) painted[row + x] = colors[mask[maskRow + x].toInt() and 0xFF]
        }
        bitmaps.drawable().setPixels(painted, 0, frame.width, 0, 0, frame.width, frame.height)
        if (legend.update(mask, crop.width * crop.height)) legendText = legendText()
        val bitmap = bitmaps.handOver()
        val text = legendText
        return VisionTask.Shown { views ->
            if (bitmaps.take(bitmap)) {
                views.overlay.setImageBitmap(bitmap)
                if (text !== legendShown) views.results.text = text
                legendShown = text
            }
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
        bitmaps = BufferHandOver(bitmap(width, height), bitmap(width, height), bitmap(width, height))
        return MaskUpsampler(shape[1], shape[2], shape[3], crop.height, crop.width).also { upsampler = it }
    }

    private fun bitmap(width: Int, height: Int) = Bitmap.createBitmap(width, height, Bitmap.Config.ARGB_8888)

    /** The classes [legend] lists, largest first, each after a swatch of its colour (an outline when transparent). */
    private fun legendText(): CharSequence {
        val text = SpannableStringBuilder()
        for ((i, entry) in legend.entries().withIndex()) {
            if (i > 0) text.append("\n")
            val start = text.length
            text.append(if (entry.color == ClassColors.TRANSPARENT) "□" else "■")
            if (entry.color != ClassColors.TRANSPARENT) {
                text.setSpan(ForegroundColorSpan(entry.color), start, text.length, Spanned.SPAN_EXCLUSIVE_EXCLUSIVE)
            }
            text.append(" ").append(context.getString(R.string.legend_line, entry.percent, entry.label))
        }
        return text
    }

    companion object {
        /** As many as the classifier's top classes: the results view's height. */
        const val LEGEND_LINES = ClassifierTask.TOP_K
    }
}
