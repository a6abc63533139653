package org.edgevit.demo

import android.content.Context
import android.view.View
import org.edgevit.demo.core.ModelMetadata
import org.edgevit.demo.core.Pixels
import org.edgevit.demo.core.Postprocessor
import java.nio.ByteBuffer

/** A classifier's output `[1, classes]` as its top-[TOP_K] labels with their probabilities. */
class ClassifierTask(
    private val context: Context,
    private val metadata: ModelMetadata,
    private val labels: List<String>,
) : VisionTask {
    override fun attach(views: ResultViews) {
        views.overlay.visibility = View.GONE
        views.overlayControls.visibility = View.GONE
    }

    override fun interpret(outputs: List<ByteBuffer>, frame: Pixels): VisionTask.Shown {
        val scores = Postprocessor.scores(outputs[0], metadata.output)
        val top = Postprocessor.classify(scores, metadata.outputKind, labels, TOP_K)
        val lines = top.joinToString("\n") { context.getString(R.string.result_line, 100f * it.probability, it.label) }
        return VisionTask.Shown { views -> views.results.text = lines }
    }

    companion object {
        const val TOP_K = 5
    }
}
