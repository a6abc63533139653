package org.edgevit.demo

import android.content.Context
import android.graphics.Bitmap
import android.graphics.Canvas
import android.graphics.Paint
import android.view.View
import org.edgevit.demo.core.BufferHandOver
import org.edgevit.demo.core.ClassColors
import org.edgevit.demo.core.Detections
import org.edgevit.demo.core.DetectorForm
import org.edgevit.demo.core.ImagePreprocessor
import org.edgevit.demo.core.ModelMetadata
import org.edgevit.demo.core.NmsOutputs
import org.edgevit.demo.core.Pixels
import org.edgevit.demo.core.SsdDecoding
import org.edgevit.demo.core.SsdPostprocessor
import java.nio.ByteBuffer
import kotlin.math.nextDown

/**
 * A detector's outputs as boxes over the frame, each with its label and score, and the same
 * detections listed under the controls. The raw form (box regressions and softmax scores) is
 * decoded against the anchors in the file's own metadata and suppressed class by class as
 * `edgevit eval` does ([SsdPostprocessor]); the NMS form's four outputs are read as they are
 * ([NmsOutputs]). Boxes are normalised to the model's input, which is the whole frame resized to
 * the square ([ImagePreprocessor.cropInImage] is all of it), so they are placed on a frame-sized
 * overlay drawn over the preview like the segmenter's mask.
 */
class DetectorTask(
    private val context: Context,
    private val metadata: ModelMetadata,
    private val labels: List<String>,
) : VisionTask {
    private val detection = metadata.detection!!
    private val preprocessor = ImagePreprocessor(metadata)
    private val raw: SsdPostprocessor? = if (detection.form != DetectorForm.RAW) null else SsdPostprocessor(
        SsdDecoding.read(context.assets.open(ModelRunner.MODEL_ASSET).use { it.readBytes() }),
        detection.outputs[0], detection.outputs[1],
        // suppression from the shown score on: the boxes kept above it are the ones a 0.01 threshold keeps
        SHOWN_SCORE.nextDown(),
    )
    private val kept = raw?.detections ?: Detections(detection.outputs[1].shape[1])

    // The model's classes are 1.. (the background left out), so a VOC class keeps its VOC colour.
    private val colors = IntArray(labels.size) { ClassColors.palette(it + 1) }
    private val boxPaint = Paint().apply {
        style = Paint.Style.STROKE
    }
    private val textPaint = Paint().apply {
        style = Paint.Style.FILL
    }

    // Sized for the frame; made again only when the frame size changes.
    private var crop = ImagePreprocessor.Crop(0, 0, 0, 0)
    private var frameWidth = 0
    private var frameHeight = 0

    // The worker draws on one, the UI thread shows another (see BufferHandOver).
    private var layers: BufferHandOver<Layer>? = null

    private class Layer(width: Int, height: Int) {
        val bitmap: Bitmap = Bitmap.createBitmap(width, height, Bitmap.Config.ARGB_8888)
        val canvas = Canvas(bitmap)
    }

    override fun attach(views: ResultViews) {
        views.overlay.setImageBitmap(null)
        views.overlay.alpha = 1f
        views.overlay.visibility = View.VISIBLE
        views.overlayControls.visibility = View.GONE
    }

    override fun interpret(outputs: List<ByteBuffer>, frame: Pixels): VisionTask.Shown {
        sizeFor(frame.width, frame.height)
        val found = raw?.process(outputs[0], outputs[1]) ?: NmsOutputs.read(outputs[0], outputs[1], outputs[2], outputs[3], kept)
        val layers = layers!!
        val layer = layers.drawable()
        val canvas = layer.canvas
        layer.bitmap.eraseColor(ClassColors.TRANSPARENT)
        val lines = StringBuilder()
        var listed = 0
        for (i in 0 until found.count) {
            val score = found.scores[i]
            val cls = found.classes[i]
            if (score < SHOWN_SCORE || cls !in labels.indices) continue
            val b = 4 * i
            val top = crop.y(found.boxes[b])
            val left = crop.x(found.boxes[b + 1])
            val bottom = crop.y(found.boxes[b + 2])
            val right = crop.x(found.boxes[b + 3])
            boxPaint.color = colors[cls]
            textPaint.color = colors[cls]
            canvas.drawRect(left, top, right, bottom, boxPaint)
            val caption = context.getString(R.string.result_line, 100f * score, labels[cls])
            canvas.drawText(caption, left + boxPaint.strokeWidth, maxOf(top - boxPaint.strokeWidth, textPaint.textSize), textPaint)
            if (listed < ClassifierTask.TOP_K) {
                if (listed > 0) lines.append("\n")
                lines.append(caption)
                listed++
            }
        }
        val text = lines.toString()
        val handed = layers.handOver()
        return VisionTask.Shown { views ->
            if (layers.take(handed)) {
                views.overlay.setImageBitmap(handed.bitmap)
                views.results.text = text
            }
        }
    }

    private fun sizeFor(width: Int, height: Int) {
        if (layers != null && width == frameWidth && height == frameHeight) return
        crop = preprocessor.cropInImage(width, height)
        frameWidth = width
        frameHeight = height
        layers = BufferHandOver(Layer(width, height), Layer(width, height), Layer(width, height))
        // Lines and text in proportion to the frame, which the overlay is scaled with.
        boxPaint.strokeWidth = maxOf(2f, minOf(width, height) / 160f)
        textPaint.textSize = maxOf(12f, minOf(width, height) / 24f)
    }

    companion object {
        /** A detection is shown from this score on (what edgevit's export compares as an app's detections). */
        const val SHOWN_SCORE = 0.5f
    }
}
