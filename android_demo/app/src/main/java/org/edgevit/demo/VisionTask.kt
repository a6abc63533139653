package org.edgevit.demo

import android.content.Context
import android.view.View
import android.widget.ImageView
import android.widget.TextView
import org.edgevit.demo.core.ModelMetadata
import org.edgevit.demo.core.Pixels
import org.edgevit.demo.core.Task
import java.nio.ByteBuffer

/** The activity's views a task shows its results in. */
class ResultViews(
    /** Lines of text under the controls: the top classes, or the legend. */
    val results: TextView,
    /** Drawn over the frame, the same size and scaling. */
    val overlay: ImageView,
    /** What adjusts the overlay (its opacity). */
    val overlayControls: View,
)

/**
 * What the app does with the model's output, one implementation per kind of model: [ClassifierTask]
 * lists the top classes, [SegmenterTask] paints the category mask over the frame, [DetectorTask]
 * draws boxes with labels and scores over it. The app picks one from the bundled model's metadata
 * ([forModel]); each kind of model is one implementation and one line there.
 */
interface VisionTask {
    /** Show or hide the views this task uses (UI thread). */
    fun attach(views: ResultViews)

    /**
     * Read [outputs], the model's outputs for [frame] in its order (worker thread); what comes back is put on screen
     * on the UI thread. Per-frame buffers belong to the task, made once (or when the frame size changes).
     */
    fun interpret(outputs: List<ByteBuffer>, frame: Pixels): Shown

    /** One frame's result, applied to the views on the UI thread. */
    fun interface Shown {
        fun show(views: ResultViews)
    }

    companion object {
        fun forModel(context: Context, metadata: ModelMetadata, labels: List<String>): VisionTask = when (metadata.task) {
            Task.CLASSIFICATION -> ClassifierTask(context, metadata, labels)
            Task.SEGMENTATION -> SegmenterTask(context, metadata, labels)
            Task.DETECTION -> DetectorTask(context, metadata, labels)
        }
    }
}
