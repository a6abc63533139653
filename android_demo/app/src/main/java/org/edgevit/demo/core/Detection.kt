package org.edgevit.demo.core

import java.nio.ByteBuffer
import java.nio.ByteOrder
import kotlin.math.exp

/**
 * How a raw SSD detector's boxes decode (MediaPipe's `DETECTOR_METADATA`, which edgevit writes into
 * the standard TFLite metadata of the file): one anchor `(ycenter, xcenter, height, width)` per box,
 * normalised, and the scales `(y, x, h, w)` the regressions are divided by before decoding.
 */
class SsdDecoding(val anchors: FloatArray, val scales: FloatArray, val numClasses: Int) {
    val numBoxes: Int get() = anchors.size / 4

    companion object {
        private const val TFLITE_METADATA = "TFLITE_METADATA"
        private const val DETECTOR_METADATA = "DETECTOR_METADATA"

        /** The decoding a `.tflite` file's bytes carry; [MetadataException] when they carry none. */
        fun read(model: ByteArray): SsdDecoding {
            val file = FlatBuffer(model)
            val root = file.root()
            val buffers = file.vector(root, 4) ?: throw MetadataException("the model has no buffers")
            val entry = file.tables(root, 6).firstOrNull { file.string(it, 0) == TFLITE_METADATA }
                ?: throw MetadataException("the model has no standard TFLite metadata ($TFLITE_METADATA)")
            val buffer = file.tableAt(buffers, file.uint(entry, 1))
            val bytes = file.bytes(buffer, 0) ?: throw MetadataException("$TFLITE_METADATA is empty")
            val metadata = FlatBuffer(bytes)
            val subgraph = metadata.tables(metadata.root(), 3).firstOrNull()
                ?: throw MetadataException("$TFLITE_METADATA describes no subgraph")
            val custom = metadata.tables(subgraph, 9).firstOrNull { metadata.string(it, 0) == DETECTOR_METADATA }
                ?: throw MetadataException("$TFLITE_METADATA has no $DETECTOR_METADATA (anchors, box decoding)")
            val options = FlatBuffer(metadata.bytes(custom, 1) ?: throw MetadataException("$DETECTOR_METADATA is empty"))
            val root2 = options.root()
            val schema = options.table(options.table(root2, 1), 0)
            val fixed = options.tables(schema, 0)
            val anchors = FloatArray(fixed.size * 4)
            for ((i, anchor) in fixed.withIndex()) {
                // FixedAnchor: x_center, y_center, width, height; kept as (y, x, h, w) like the boxes
                anchors[4 * i] = options.float(anchor, 1)
                anchors[4 * i + 1] = options.float(anchor, 0)
                anchors[4 * i + 2] = options.float(anchor, 3)
                anchors[4 * i + 3] = options.float(anchor, 2)
            }
            val decoding = options.table(root2, 2)
            val scales = floatArrayOf(options.float(decoding, 7), options.float(decoding, 6),
                options.float(decoding, 9), options.float(decoding, 8))
            if (scales.any { !(it > 0f) }) throw MetadataException("$DETECTOR_METADATA has box scales ${scales.toList()}")
            val boxes = options.int(decoding, 1)
            if (fixed.isEmpty() || boxes != fixed.size) {
                throw MetadataException("$DETECTOR_METADATA holds ${fixed.size} anchors for $boxes boxes")
            }
            return SsdDecoding(anchors, scales, options.int(decoding, 0))
        }
    }
}

/**
 * A frame's detections, best first: [count] boxes `(ymin, xmin, ymax, xmax)` normalised to the
 * model's input, their classes (columns of the scores, labels' lines) and scores. Made once with
 * room for [capacity] and refilled every frame.
 */
class Detections(val capacity: Int) {
    var count = 0
    val boxes = FloatArray(capacity * 4)
    val classes = IntArray(capacity)
    val scores = FloatArray(capacity)
}

/**
 * A raw SSD detector's outputs to detections, as MediaPipe's ObjectDetector shows a raw file's and
 * `edgevit eval` scores them by default (`edgevit.models.box_coding`: `decode`, then
 * `best_class_nms` at `edgevit.evaluate`'s `MEDIAPIPE_IOU` and `MEDIAPIPE_DETECTIONS`): the uint8
 * regressions and softmax scores dequantized, the boxes decoded against the anchors, each anchor's
 * best class (the file has no background column), the anchors scoring above [confidence], one
 * greedy suppression over all classes (a box goes when it overlaps a better one of any class by
 * more than [iou]), the first [maxDetections] kept. Ties keep the lower class of an anchor, then
 * the lower anchor (numpy's argmax and stable sort). Every buffer is made here, none per frame.
 */
class SsdPostprocessor(
    private val decoding: SsdDecoding,
    private val boxesInfo: TensorInfo,
    private val scoresInfo: TensorInfo,
    private val confidence: Float,
    private val iou: Float = NMS_IOU,
    maxDetections: Int = DETECTIONS,
) {
    private val anchorCount = decoding.numBoxes
    private val classCount = scoresInfo.shape.last()
    private val regressions = FloatArray(boxesInfo.elementCount)
    private val scores = FloatArray(scoresInfo.elementCount)
    private val boxes = FloatArray(anchorCount * 4)
    private val bestClass = IntArray(anchorCount)
    private val bestScore = FloatArray(anchorCount)
    private val candidates = IntArray(anchorCount)
    private val suppressed = BooleanArray(anchorCount)
    val detections = Detections(maxDetections)

    // The variances (1 / scale) in float32, as edgevit's decode multiplies by them.
    private val variances = FloatArray(4) { 1f / decoding.scales[it] }

    init {
        require(boxesInfo.shape == listOf(1, anchorCount, 4)) { "boxes ${boxesInfo.shape} for $anchorCount anchors" }
        require(scoresInfo.shape == listOf(1, anchorCount, classCount)) { "scores ${scoresInfo.shape} for $anchorCount anchors" }
    }

    /** Read the two outputs (from their current positions) into [detections]. */
    fun process(boxesOutput: ByteBuffer, scoresOutput: ByteBuffer): Detections {
        MaskUpsampler.readLogits(boxesOutput, boxesInfo, regressions)
        MaskUpsampler.readLogits(scoresOutput, scoresInfo, scores)
        decode()
        var n = 0
        for (a in 0 until anchorCount) {
            val row = a * classCount
            var best = 0
            for (cls in 1 until classCount) if (scores[row + cls] > scores[row + best]) best = cls
            bestClass[a] = best
            bestScore[a] = scores[row + best]
            if (bestScore[a] > confidence) candidates[n++] = a
        }
        sortByScore(candidates, n) { bestScore[it] }
        for (i in 0 until n) suppressed[i] = false
        val out = detections
        var kept = 0
        // a box is suppressed only by better ones: the first [maxDetections] kept are final
        for (i in 0 until n) {
            if (kept == out.capacity) break
            if (suppressed[i]) continue
            val a = candidates[i]
            System.arraycopy(boxes, a * 4, out.boxes, kept * 4, 4)
            out.classes[kept] = bestClass[a]
            out.scores[kept] = bestScore[a]
            kept++
            for (j in i + 1 until n) if (!suppressed[j] && overlap(a, candidates[j]) > iou) suppressed[j] = true
        }
        out.count = kept
        return out
    }

    /** `box_coding.decode`: centre and log-size regressions against the anchors, to corners. */
    private fun decode() {
        val a = decoding.anchors
        for (i in 0 until anchorCount) {
            val o = i * 4
            val cy = regressions[o] * variances[0] * a[o + 2] + a[o]
            val cx = regressions[o + 1] * variances[1] * a[o + 3] + a[o + 1]
            val h = exp(regressions[o + 2] * variances[2]) * a[o + 2]
            val w = exp(regressions[o + 3] * variances[3]) * a[o + 3]
            boxes[o] = cy - h / 2f
            boxes[o + 1] = cx - w / 2f
            boxes[o + 2] = cy + h / 2f
            boxes[o + 3] = cx + w / 2f
        }
    }

    /** `box_coding.iou` of two decoded boxes, in the same float32 steps. */
    private fun overlap(i: Int, j: Int): Float {
        val p = i * 4
        val q = j * 4
        val dy = maxOf(minOf(boxes[p + 2], boxes[q + 2]) - maxOf(boxes[p], boxes[q]), 0f)
        val dx = maxOf(minOf(boxes[p + 3], boxes[q + 3]) - maxOf(boxes[p + 1], boxes[q + 1]), 0f)
        val inter = dy * dx
        val areaP = maxOf(boxes[p + 2] - boxes[p], 0f) * maxOf(boxes[p + 3] - boxes[p + 1], 0f)
        val areaQ = maxOf(boxes[q + 2] - boxes[q], 0f) * maxOf(boxes[q + 3] - boxes[q + 1], 0f)
        val union = areaP + areaQ - inter
        return if (union > 0f) inter / union else 0f
    }

    companion object {
        // MediaPipe's ObjectDetector on a raw file, as `edgevit eval` scores it: box_coding.CONFIDENCE,
        // edgevit.evaluate.MEDIAPIPE_IOU and MEDIAPIPE_DETECTIONS.
        const val CONFIDENCE = 0.01f
        const val NMS_IOU = 0.3f
        const val DETECTIONS = 100

        /**
         * Stable sort of the first [n] of [items] by [score], highest first: insertion sort, no
         * allocation; the candidates above the score the app shows are few.
         */
        private inline fun sortByScore(items: IntArray, n: Int, score: (Int) -> Float) {
            for (i in 1 until n) {
                val item = items[i]
                val s = score(item)
                var j = i - 1
                while (j >= 0 && score(items[j]) < s) {
                    items[j + 1] = items[j]
                    j--
                }
                items[j + 1] = item
            }
        }
    }
}

/**
 * The four float32 outputs of TFLite's detection post-processing op (the NMS form): boxes
 * `(ymin, xmin, ymax, xmax)`, classes (from 0, the labels' lines), scores, and how many are valid.
 */
object NmsOutputs {
    fun read(boxes: ByteBuffer, classes: ByteBuffer, scores: ByteBuffer, count: ByteBuffer, into: Detections): Detections {
        val n = minOf(count.getFloat(0).toInt(), into.capacity).coerceAtLeast(0)
        for (i in 0 until n) {
            for (k in 0 until 4) into.boxes[4 * i + k] = boxes.getFloat((4 * i + k) * 4)
            into.classes[i] = classes.getFloat(i * 4).toInt()
            into.scores[i] = scores.getFloat(i * 4)
        }
        into.count = n
        return into
    }
}

/** The few reads of a flatbuffer (tables, vectors, strings, scalars) the metadata needs, each bounds-checked. */
private class FlatBuffer(private val bytes: ByteArray) {
    private val data: ByteBuffer = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN)

    private fun at(offset: Int, size: Int): Int {
        if (offset < 0 || size < 0 || offset > bytes.size - size) throw MetadataException("the model's metadata is cut short")
        return offset
    }

    fun root(): Int = at(data.getInt(at(0, 4)), 4)

    /** Where [table]'s field [slot] is, or 0 when absent. */
    private fun field(table: Int, slot: Int): Int {
        val vtable = table - data.getInt(at(table, 4))
        val vtableSize = data.getShort(at(vtable, 2)).toInt() and 0xFFFF
        val entry = 4 + 2 * slot
        if (entry + 2 > vtableSize) return 0
        val offset = data.getShort(at(vtable + entry, 2)).toInt() and 0xFFFF
        return if (offset == 0) 0 else table + offset
    }

    private fun indirect(at: Int): Int = at + data.getInt(at(at, 4))

    fun table(table: Int, slot: Int): Int {
        val f = field(table, slot)
        if (f == 0) throw MetadataException("the model's metadata lacks a field it needs")
        return at(indirect(f), 4)
    }

    fun vector(table: Int, slot: Int): Int? {
        val f = field(table, slot)
        return if (f == 0) null else at(indirect(f), 4)
    }

    private fun length(vector: Int): Int = data.getInt(vector)

    fun tableAt(vector: Int, index: Int): Int {
        if (index < 0 || index >= length(vector)) throw MetadataException("the model's metadata names a missing buffer")
        return at(indirect(at(vector + 4 + 4 * index, 4)), 4)
    }

    fun tables(table: Int, slot: Int): List<Int> {
        val vector = vector(table, slot) ?: return emptyList()
        at(vector + 4, 4 * length(vector))
        return List(length(vector)) { tableAt(vector, it) }
    }

    fun bytes(table: Int, slot: Int): ByteArray? {
        val vector = vector(table, slot) ?: return null
        val start = at(vector + 4, length(vector))
        return bytes.copyOfRange(start, start + length(vector))
    }

    fun string(table: Int, slot: Int): String? = bytes(table, slot)?.toString(Charsets.UTF_8)

    fun uint(table: Int, slot: Int): Int = field(table, slot).let { if (it == 0) 0 else data.getInt(at(it, 4)) }

    fun int(table: Int, slot: Int): Int = uint(table, slot)

    fun float(table: Int, slot: Int): Float = field(table, slot).let { if (it == 0) 0f else data.getFloat(at(it, 4)) }
}
