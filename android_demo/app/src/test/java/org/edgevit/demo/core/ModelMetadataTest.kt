package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.assertNull
import org.junit.Assert.assertTrue
import org.junit.Assert.fail
import org.junit.Test

class ModelMetadataTest {
    private val doc = """
        {
          "schema": "edgevit-model-metadata", "schema_version": 1, "edgevit_version": "0.1.0",
          "model": "mobilevit_v3_xs", "family": "mobilevit_v3", "precision": "int8", "weights": "random-init",
          "num_classes": 3, "labels": ["tench", "goldfish", "great white shark"],
          "labels_file": "mobilevit_v3_xs_int8.labels.txt",
          "input": {"shape": [1, 256, 256, 3], "layout": "NHWC", "dtype": "int8",
                    "quantization": {"scale": 0.003921569, "zero_point": -128}},
          "output": {"shape": [1, 3], "dtype": "uint8", "quantization": {"scale": 0.1, "zero_point": 5},
                     "kind": "logits"},
          "preprocessing": {"input_size": 256, "resize_size": 288, "interpolation": "bilinear",
                            "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "value_range": [0.0, 1.0]}
        }
    """.trimIndent()

    @Test
    fun parsesTheDocumentedExample() {
        val m = ModelMetadata.parse(doc)
        assertEquals("mobilevit_v3_xs", m.model)
        assertEquals(256, m.inputSize)
        assertEquals(TensorType.INT8, m.input.type)
        assertEquals(Quantization(0.003921569f, -128), m.input.quantization)
        assertEquals(TensorType.UINT8, m.output.type)
        assertEquals(3, m.output.byteSize)
        assertEquals(256 * 256 * 3, m.input.byteSize)
        assertEquals(OutputKind.LOGITS, m.outputKind)
        assertEquals(288, m.preprocessing.resizeSize)
        assertEquals(listOf("tench", "goldfish", "great white shark"), m.labels)
    }

    @Test
    fun floatTensorsCarryNoQuantization() {
        val m = ModelMetadata.parse(
            doc.replace(Regex("\"dtype\": \"int8\",\\s*\"quantization\": \\{[^}]*\\}"),
                "\"dtype\": \"float32\", \"quantization\": null"),
        )
        assertEquals(TensorType.FLOAT32, m.input.type)
        assertNull(m.input.quantization)
    }

    @Test
    fun theTaskDecidesTheOutputShape() {
        assertEquals(Task.CLASSIFICATION, ModelMetadata.parse(doc).task)
        val segmenter = doc.replace("\"family\"", "\"task\": \"segmentation\", \"family\"")
            .replace("\"shape\": [1, 3]", "\"shape\": [1, 16, 16, 3]")
        val m = ModelMetadata.parse(segmenter)
        assertEquals(Task.SEGMENTATION, m.task)
        assertEquals(3, m.numClasses)
        assertEquals(16 * 16 * 3, m.output.byteSize)
        assertRejected(doc.replace("\"shape\": [1, 3]", "\"shape\": [1, 16, 16, 3]"), "[1, 16, 16, 3]", "[1, classes]")
        assertRejected(segmenter.replace("[1, 16, 16, 3]", "[1, 3]"), "[1, height, width, classes]")
        assertRejected(segmenter.replace("\"segmentation\"", "\"keypoints\""), "unsupported task 'keypoints'")
        val detector = segmenter.replace("\"segmentation\"", "\"detection\"")
        assertRejected(detector, "[1, 16, 16, 3]", "[1, boxes, 4]")
        assertRejected(detector.replace("[1, 16, 16, 3]", "[1, 16, 4]"), "missing object 'detection'")
    }

    private fun assertRejected(json: String, vararg words: String) {
        try {
            ModelMetadata.parse(json)
            fail("accepted: $json")
        } catch (e: MetadataException) {
            for (w in words) assertTrue("'${e.message}' should mention '$w'", e.message!!.contains(w))
        }
    }

    @Test
    fun rejectsWhatTheAppCannotRun() {
        assertRejected("{", "not valid JSON")
        assertRejected("[]", "not a JSON object")
        assertRejected(doc.replace("edgevit-model-metadata", "other"), "schema")
        assertRejected(doc.replace("\"schema_version\": 1", "\"schema_version\": 2"), "schema_version 2")
        assertRejected(doc.replace("\"dtype\": \"int8\"", "\"dtype\": \"int16\""), "int16")
        assertRejected(doc.replace("\"scale\": 0.003921569, ", ""), "scale")
        assertRejected(doc.replace("[1, 256, 256, 3]", "[1, 3, 256, 256]"), "input shape")
        assertRejected(doc.replace("\"input_size\": 256", "\"input_size\": 224"), "input_size 224")
        assertRejected(doc.replace("\"num_classes\": 3", "\"num_classes\": 4"), "num_classes 4")
        assertRejected(doc.replace("\"bilinear\"", "\"lanczos\""), "lanczos")
        assertRejected(doc.replace("\"std\": [1.0, 1.0, 1.0]", "\"std\": [1.0, 0.0, 1.0]"), "std")
        assertRejected(doc.replace("\"mean\": [0.0, 0.0, 0.0]", "\"mean\": [0.0, 0.0]"), "mean", "3 values")
        assertRejected(doc.replace("\"kind\": \"logits\"", "\"kind\": \"boxes\""), "boxes")
    }

    @Test
    fun labelsFileWinsWhenItFits() {
        val m = ModelMetadata.parse(doc)
        assertEquals(listOf("a", "b", "c"), Labels.choose(m, Labels.parse("a\nb\nc\n")))
        assertEquals(m.labels, Labels.choose(m, Labels.parse("a\nb\n")))
        assertEquals(m.labels, Labels.choose(m, null))
        assertEquals(listOf("x", "", "z"), Labels.parse("x\r\n\r\nz"))
    }
}
