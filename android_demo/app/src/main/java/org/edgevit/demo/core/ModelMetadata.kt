package org.edgevit.demo.core

/** Element type of a model input or output tensor. */
enum class TensorType(val jsonName: String, val bytesPerElement: Int) {
    FLOAT32("float32", 4),
    INT8("int8", 1),
    UINT8("uint8", 1);

    val isQuantized get() = this != FLOAT32

    companion object {
        fun of(name: String): TensorType = entries.firstOrNull { it.jsonName == name }
            ?: throw MetadataException("unsupported tensor dtype '$name' (expected float32, int8 or uint8)")
    }
}

/** Affine quantization: real value = scale * (q - zeroPoint). */
data class Quantization(val scale: Float, val zeroPoint: Int)

data class TensorInfo(val shape: List<Int>, val type: TensorType, val quantization: Quantization?) {
    val elementCount: Int get() = shape.fold(1) { acc, d -> acc * d }
    val byteSize: Int get() = elementCount * type.bytesPerElement
}

enum class Interpolation(val jsonName: String) {
    BILINEAR("bilinear"),
    BICUBIC("bicubic");

    companion object {
        fun of(name: String): Interpolation = entries.firstOrNull { it.jsonName == name }
            ?: throw MetadataException("unsupported interpolation '$name' (expected bilinear or bicubic)")
    }
}

/** How a model wants its image: see docs/model-metadata.md ("Preprocessing recipe"). */
data class Preprocessing(
    val inputSize: Int,
    val resizeSize: Int,
    val interpolation: Interpolation,
    val mean: List<Float>,
    val std: List<Float>,
    val valueRange: List<Float>,
    /** What the input tensor takes (metadata `input.takes`); the file normalises the image itself for RGB_*. */
    val takes: InputKind = InputKind.NORMALISED,
)

/** The normalised image; the camera's bytes (uint8); or pixels / 255 (float). */
enum class InputKind(val jsonName: String) {
    NORMALISED("normalised"), RGB_BYTES("rgb_bytes"), RGB_UNIT("rgb_unit");

    companion object {
        fun of(name: String): InputKind = entries.firstOrNull { it.jsonName == name }
            ?: throw MetadataException("unsupported input.takes '$name' (expected normalised, rgb_bytes or rgb_unit)")
    }
}

enum class OutputKind { LOGITS, PROBABILITIES }

/** What the model does (metadata `task`; a document without one is a classifier's). */
enum class Task(val jsonName: String) {
    /** Class scores `[1, classes]`. */
    CLASSIFICATION("classification"),

    /** Logits `[1, h, w, classes]` at the model's output stride. */
    SEGMENTATION("segmentation"),

    /** An SSD detector's outputs, in one of two [DetectorForm]s (metadata `detection`). */
    DETECTION("detection");

    companion object {
        fun of(name: String): Task = entries.firstOrNull { it.jsonName == name }
            ?: throw MetadataException("unsupported task '$name' (expected classification, segmentation or detection)")
    }
}

/** What a detector file outputs (metadata `detection.form`). */
enum class DetectorForm(val jsonName: String) {
    /** Box regressions `[1, anchors, 4]` and softmax scores `[1, anchors, classes]`: the app decodes and suppresses. */
    RAW("raw"),

    /** The detection post-processing op's boxes, classes, scores and count, float32. */
    NMS("nms");

    companion object {
        fun of(name: String): DetectorForm = entries.firstOrNull { it.jsonName == name }
            ?: throw MetadataException("unsupported detection.form '$name' (expected raw or nms)")
    }
}

/** A detector's metadata `detection` block: its form and every output, in the file's order. */
data class DetectorOutputs(val form: DetectorForm, val outputs: List<TensorInfo>)

/**
 * The metadata edgevit writes next to every model (`NAME.json`, bundled as
 * `model.json`). Everything the app needs to feed and read any edgevit model.
 */
data class ModelMetadata(
    val model: String,
    val family: String,
    val precision: String,
    val weights: String,
    val task: Task,
    val numClasses: Int,
    val labels: List<String>,
    val input: TensorInfo,
    val output: TensorInfo,
    val outputKind: OutputKind,
    val preprocessing: Preprocessing,
    /** A detector's outputs (null for other tasks); [output] is then its first. */
    val detection: DetectorOutputs? = null,
) {
    val inputSize: Int get() = preprocessing.inputSize

    companion object {
        const val SCHEMA = "edgevit-model-metadata"
        const val SCHEMA_VERSION = 1

        /** Parse and check a metadata document; errors say which field is wrong. */
        fun parse(json: String): ModelMetadata {
            val root = try {
                Json.parse(json)
            } catch (e: JsonException) {
                throw MetadataException("model metadata is not valid JSON: ${e.message}")
            }
            val doc = root as? Map<*, *> ?: throw MetadataException("model metadata is not a JSON object")
            val schema = doc["schema"]
            if (schema != SCHEMA) throw MetadataException("not edgevit model metadata (schema is '$schema')")
            val version = number(doc, "schema_version").toInt()
            if (version != SCHEMA_VERSION) {
                throw MetadataException("metadata schema_version $version; this app reads version $SCHEMA_VERSION")
            }
            val input = tensor(obj(doc, "input"), "input")
            val output = tensor(obj(doc, "output"), "output")
            val pre = preprocessing(obj(doc, "preprocessing"))
                .copy(takes = InputKind.of(obj(doc, "input")["takes"]?.toString() ?: "normalised"))
            val shape = input.shape
            if (shape.size != 4 || shape[0] != 1 || shape[3] != 3 || shape[1] != shape[2]) {
                throw MetadataException("input shape $shape: the app feeds one square RGB image [1, S, S, 3]")
            }
            if (pre.inputSize != shape[1]) {
                throw MetadataException("preprocessing.input_size ${pre.inputSize} does not match input shape $shape")
            }
            val task = Task.of(doc["task"]?.toString() ?: "classification")
            val expected = when (task) {
                Task.CLASSIFICATION -> "class scores [1, classes]"
                Task.SEGMENTATION -> "a segmenter's logits [1, height, width, classes]"
                Task.DETECTION -> "a detector's boxes [1, boxes, 4]"
            }
            val rank = when (task) {
                Task.CLASSIFICATION -> 2
                Task.SEGMENTATION -> 4
                Task.DETECTION -> 3
            }
            if (output.shape.size != rank || output.shape[0] != 1 || output.shape.any { it < 1 }) {
                throw MetadataException("output shape ${output.shape}: the app reads $expected")
            }
            val labels = (doc["labels"] as? List<*>)?.map { it.toString() } ?: emptyList()
            val numClasses = number(doc, "num_classes").toInt()
            val detection = if (task == Task.DETECTION) detection(obj(doc, "detection"), output, numClasses) else null
            if (detection == null && numClasses != output.shape.last()) {
                throw MetadataException("num_classes $numClasses does not match output shape ${output.shape}")
            }
            val kind = when (val k = obj(doc, "output")["kind"] ?: "logits") {
                "logits", "box_encodings", "detection_boxes" -> OutputKind.LOGITS
                "probabilities" -> OutputKind.PROBABILITIES
                else -> throw MetadataException("unsupported output kind '$k'")
            }
            return ModelMetadata(
                model = string(doc, "model"),
                family = doc["family"]?.toString() ?: "",
                precision = string(doc, "precision"),
                weights = doc["weights"]?.toString() ?: "",
                task = task,
                numClasses = numClasses,
                labels = labels,
                input = input,
                output = output,
                outputKind = kind,
                preprocessing = pre,
                detection = detection,
            )
        }

        /** A detector's block, checked against the shapes the app reads for its form. */
        private fun detection(m: Map<*, *>, output: TensorInfo, numClasses: Int): DetectorOutputs {
            val form = DetectorForm.of(m["form"]?.toString() ?: throw MetadataException("missing detection.form"))
            val outputs = (m["outputs"] as? List<*>)?.mapIndexed { i, o ->
                tensor(o as? Map<*, *> ?: throw MetadataException("detection.outputs[$i] is not an object"), "detection.outputs[$i]")
            } ?: throw MetadataException("missing detection.outputs")
            val shapes = outputs.map { it.shape }
            val fits = when (form) {
                DetectorForm.RAW -> outputs.size == 2 && shapes[1].size == 3 && shapes[1][0] == 1 &&
                    shapes[1][1] == shapes[0][1] && shapes[1][2] == numClasses
                DetectorForm.NMS -> outputs.size == 4 && outputs.all { it.type == TensorType.FLOAT32 } &&
                    shapes[1] == listOf(1, shapes[0][1]) && shapes[2] == shapes[1] && shapes[3] == listOf(1)
            }
            if (!fits || outputs[0] != output) {
                throw MetadataException(
                    "detection.outputs $shapes: the app reads " + when (form) {
                        DetectorForm.RAW -> "boxes [1, anchors, 4] and scores [1, anchors, $numClasses]"
                        DetectorForm.NMS -> "the post-processing op's boxes [1, N, 4], classes [1, N], scores [1, N], count [1], float32"
                    },
                )
            }
            return DetectorOutputs(form, outputs)
        }

        private fun tensor(m: Map<*, *>, name: String): TensorInfo {
            val shape = (m["shape"] as? List<*>)?.map { (it as? Double)?.toInt() ?: bad("$name.shape", it) }
                ?: throw MetadataException("missing $name.shape")
            val type = TensorType.of(m["dtype"]?.toString() ?: throw MetadataException("missing $name.dtype"))
            val q = m["quantization"] as? Map<*, *>
            val quantization = q?.let { Quantization(number(it, "scale").toFloat(), number(it, "zero_point").toInt()) }
            if (type.isQuantized && quantization == null) {
                throw MetadataException("$name is ${type.jsonName} but has no quantization parameters")
            }
            if (quantization != null && !(quantization.scale > 0f && quantization.scale.isFinite())) {
                throw MetadataException("$name quantization scale ${quantization.scale} is not a positive number")
            }
            return TensorInfo(shape, type, if (type.isQuantized) quantization else null)
        }

        private fun preprocessing(m: Map<*, *>): Preprocessing {
            fun triple(key: String): List<Float> {
                val values = (m[key] as? List<*>)?.map { (it as? Double)?.toFloat() ?: bad("preprocessing.$key", it) }
                    ?: throw MetadataException("missing preprocessing.$key")
                if (values.size != 3) throw MetadataException("preprocessing.$key needs 3 values, got ${values.size}")
                return values
            }
            val std = triple("std")
            if (std.any { it == 0f }) throw MetadataException("preprocessing.std has a zero: $std")
            val inputSize = number(m, "input_size").toInt()
            val resizeSize = number(m, "resize_size").toInt()
            if (inputSize <= 0 || resizeSize <= 0) {
                throw MetadataException("preprocessing sizes must be positive (input_size $inputSize, resize_size $resizeSize)")
            }
            val range = (m["value_range"] as? List<*>)?.map { (it as? Double)?.toFloat() ?: 0f } ?: emptyList()
            return Preprocessing(
                inputSize = inputSize,
                resizeSize = resizeSize,
                interpolation = Interpolation.of(m["interpolation"]?.toString() ?: "bilinear"),
                mean = triple("mean"),
                std = std,
                valueRange = range,
            )
        }

        private fun obj(m: Map<*, *>, key: String): Map<*, *> =
            m[key] as? Map<*, *> ?: throw MetadataException("missing object '$key'")

        private fun number(m: Map<*, *>, key: String): Double =
            m[key] as? Double ?: throw MetadataException("missing or non-numeric '$key'")

        private fun string(m: Map<*, *>, key: String): String =
            m[key] as? String ?: throw MetadataException("missing '$key'")

        private fun bad(field: String, value: Any?): Nothing =
            throw MetadataException("$field has a non-numeric value '$value'")
    }
}

/** The labels file: one label per line, line i is class i. */
object Labels {
    fun parse(text: String): List<String> {
        val lines = text.split("\n").map { it.removeSuffix("\r") }
        return if (lines.isNotEmpty() && lines.last().isEmpty()) lines.dropLast(1) else lines
    }

    /** The labels to show for [metadata]: the labels file when it fits, else the metadata's own list. */
    fun choose(metadata: ModelMetadata, fileLabels: List<String>?): List<String> = when {
        fileLabels != null && fileLabels.size == metadata.numClasses -> fileLabels
        metadata.labels.size == metadata.numClasses -> metadata.labels
        else -> List(metadata.numClasses) { "class $it" }
    }
}

class MetadataException(message: String) : IllegalArgumentException(message)
