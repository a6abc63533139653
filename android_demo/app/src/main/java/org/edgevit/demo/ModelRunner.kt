package org.edgevit.demo

import android.content.Context
import android.content.res.AssetManager
import android.os.Build
import android.os.SystemClock
import org.edgevit.demo.core.Accelerator
import org.edgevit.demo.core.GpuCheck
import org.edgevit.demo.core.GpuCheckState
import org.edgevit.demo.core.GpuVerdicts
import org.edgevit.demo.core.ImagePreprocessor
import org.edgevit.demo.core.Labels
import org.edgevit.demo.core.ModelMetadata
import org.edgevit.demo.core.OutputAgreement
import org.edgevit.demo.core.TensorType
import org.tensorflow.lite.DataType
import org.tensorflow.lite.Delegate
import org.tensorflow.lite.Interpreter
import org.tensorflow.lite.gpu.CompatibilityList
import org.tensorflow.lite.gpu.GpuDelegate
import org.tensorflow.lite.nnapi.NnApiDelegate
import java.io.Closeable
import java.io.FileNotFoundException
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The bundled model (assets `model.tflite`, `model.json`, `labels.txt`) on a
 * LiteRT Interpreter, on the accelerator asked for when the device can run it
 * there, else on the CPU; on the GPU only while its outputs match the CPU's
 * (see [gpuCheck]). It feeds a frame and runs the model; what the output
 * means is the [VisionTask]'s business.
 *
 * Not thread-safe: use one instance from one thread at a time.
 */
class ModelRunner private constructor(
    val metadata: ModelMetadata,
    val labels: List<String>,
    private var session: Session,
    /** The CPU session the first GPU frame is checked against; null once checked, or when no check is due. */
    private var cpuReference: Session?,
    val gpuCheck: GpuCheck,
    val threads: Int,
) : Closeable {
    /** An interpreter with the delegate it owns (null on the CPU). */
    class Session(val interpreter: Interpreter, val delegate: Delegate?) : Closeable {
        override fun close() {
            interpreter.close()
            delegate?.close()
        }
    }

    /** [gpuCheckResult]: set on the one frame that compared the GPU with the CPU. */
    class Timing(
        val preprocessMs: Double,
        val inferenceMs: Double,
        val gpuCheckResult: OutputAgreement?,
    )

    private val preprocessor = ImagePreprocessor(metadata)
    private val input = preprocessor.newInputBuffer()
    private val outputs = newOutputBuffers(metadata)
    private val outputsByIndex = indexed(outputs)
    private val inputs = arrayOf<Any>(input)

    /** Run the model on packed ARGB pixels ([width] x [height], upright); [outputs] then holds its outputs. */
    fun run(argb: IntArray, width: Int, height: Int): Timing {
        val start = SystemClock.elapsedRealtimeNanos()
        input.rewind()
        preprocessor.process(argb, width, height, input)
        input.rewind()
        val preprocessed = SystemClock.elapsedRealtimeNanos()
        outputs.forEach { it.rewind() }
        runInto(session.interpreter, inputs, outputs, outputsByIndex)
        val inferred = SystemClock.elapsedRealtimeNanos()
        val gpuCheckResult = cpuReference?.let { checkGpuAgainst(it) }
        return Timing((preprocessed - start) / 1e6, (inferred - preprocessed) / 1e6, gpuCheckResult)
    }

    /** The output tensors of the last [run] in the model's order, from their start (read them before the next run). */
    fun outputs(): List<ByteBuffer> {
        outputs.forEach { it.rewind() }
        return outputs
    }

    /**
     * Run the input the GPU just ran on [cpu] as well and let [gpuCheck] compare. When it rejects
     * the GPU, the CPU session takes over, starting with this frame's outputs.
     */
    private fun checkGpuAgainst(cpu: Session): OutputAgreement {
        cpuReference = null
        gpuCheck.begin()
        val cpuOutputs = newOutputBuffers(metadata)
        try {
            input.rewind()
            runInto(cpu.interpreter, inputs, cpuOutputs, indexed(cpuOutputs))
        } catch (e: Exception) {
            cpu.close()
            throw e
        }
        (outputs + cpuOutputs).forEach { it.rewind() }
        val agreement = gpuCheck.finish(outputs, cpuOutputs, outputInfos(metadata))
        if (gpuCheck.active == Accelerator.CPU) {
            session.close()
            session = cpu
            for ((mine, cpus) in outputs.zip(cpuOutputs)) {
                mine.clear()
                cpus.rewind()
                mine.put(cpus)
            }
        } else {
            cpu.close()
        }
        return agreement
    }

    override fun close() {
        session.close()
        cpuReference?.close()
    }

    companion object {
        const val MODEL_ASSET = "model.tflite"
        const val METADATA_ASSET = "model.json"
        const val LABELS_ASSET = "labels.txt"

        fun hasModel(assets: AssetManager): Boolean =
            assets.list("")?.let { MODEL_ASSET in it && METADATA_ASSET in it } == true

        /**
         * Load the bundled model on [requested] (or the CPU, see [GpuCheck.open]) with [threads] CPU
         * threads; [gpuVerdicts] holds the GPU checks already done.
         */
        fun create(context: Context, requested: Accelerator, threads: Int, gpuVerdicts: GpuVerdicts): ModelRunner {
            val assets = context.assets
            val metadata = ModelMetadata.parse(readText(assets, METADATA_ASSET))
            val fileLabels = try {
                Labels.parse(readText(assets, LABELS_ASSET))
            } catch (e: FileNotFoundException) {
                null
            }
            val modelBytes = assets.open(MODEL_ASSET).use { it.readBytes() }
            val model = directBuffer(modelBytes)
            val modelKey = GpuVerdicts.modelKey(modelBytes)
            val (session, gpuCheck) = GpuCheck.open(requested, modelKey, gpuVerdicts, ::unsupportedReason) {
                openSession(model, metadata, it, threads)
            }
            val cpuReference = if (gpuCheck.state != GpuCheckState.UNVERIFIED) null else try {
                openSession(model, metadata, Accelerator.CPU, threads)
            } catch (e: Exception) {
                session.close()
                throw e
            }
            return ModelRunner(metadata, Labels.choose(metadata, fileLabels), session, cpuReference, gpuCheck, threads)
        }

        /** The cheap compatibility check before trying a delegate; null when it may work. */
        fun unsupportedReason(accelerator: Accelerator): String? = when (accelerator) {
            Accelerator.CPU -> null
            Accelerator.GPU -> CompatibilityList().use { list ->
                if (list.isDelegateSupportedOnThisDevice) null else "this device's GPU is not supported by the GPU delegate"
            }
            Accelerator.NNAPI ->
                if (Build.VERSION.SDK_INT < Build.VERSION_CODES.O_MR1) "NNAPI needs Android 8.1 (API 27)" else null
        }

        private fun openSession(model: ByteBuffer, metadata: ModelMetadata, accelerator: Accelerator, threads: Int): Session {
            val delegate: Delegate? = when (accelerator) {
                Accelerator.CPU -> null
                Accelerator.GPU -> CompatibilityList().use { GpuDelegate(it.bestOptionsForThisDevice) }
                Accelerator.NNAPI -> NnApiDelegate()
            }
            try {
                val options = Interpreter.Options().setNumThreads(threads)
                if (delegate != null) options.addDelegate(delegate)
                val interpreter = Interpreter(model, options)
                try {
                    checkTensors(interpreter, metadata)
                    // A delegate may accept the graph and fail on the first run: run once here,
                    // so that failure also falls back to the CPU instead of failing later.
                    val input = ByteBuffer.allocateDirect(metadata.input.byteSize).order(ByteOrder.nativeOrder())
                    val outputs = newOutputBuffers(metadata)
                    runInto(interpreter, arrayOf(input), outputs, indexed(outputs))
                } catch (e: Exception) {
                    interpreter.close()
                    throw e
                }
                return Session(interpreter, delegate)
            } catch (e: Exception) {
                delegate?.close()
                throw e
            }
        }

        /** The metadata must describe the model it came with; say so clearly when it does not. */
        private fun checkTensors(interpreter: Interpreter, metadata: ModelMetadata) {
            val input = interpreter.getInputTensor(0)
            val expected = listOf("input" to Triple(metadata.input.shape, metadata.input.type, input)) +
                outputInfos(metadata).mapIndexed { i, info ->
                    "output $i" to Triple(info.shape, info.type, interpreter.getOutputTensor(i))
                }
            if (interpreter.outputTensorCount != expected.size - 1) {
                throw IllegalStateException(
                    "$METADATA_ASSET describes ${expected.size - 1} outputs, but $MODEL_ASSET has " +
                        "${interpreter.outputTensorCount}: bundle them together again",
                )
            }
            for ((name, spec) in expected) {
                val (shape, type, tensor) = spec
                val actualType = when (tensor.dataType()) {
                    DataType.FLOAT32 -> TensorType.FLOAT32
                    DataType.INT8 -> TensorType.INT8
                    DataType.UINT8 -> TensorType.UINT8
                    else -> null
                }
                if (tensor.shape().toList() != shape || actualType != type) {
                    throw IllegalStateException(
                        "$METADATA_ASSET says the $name is $shape ${type.jsonName}, but $MODEL_ASSET has " +
                            "${tensor.shape().toList()} ${tensor.dataType()}: bundle them together again",
                    )
                }
            }
        }

        private fun readText(assets: AssetManager, name: String): String =
            assets.open(name).use { it.readBytes().toString(Charsets.UTF_8) }

        /** The model in a direct buffer, as the Interpreter requires. */
        private fun directBuffer(bytes: ByteArray): ByteBuffer {
            val buffer = ByteBuffer.allocateDirect(bytes.size).order(ByteOrder.nativeOrder())
            buffer.put(bytes)
            buffer.rewind()
            return buffer
        }

        /** Every output the model has: a detector's (metadata `detection.outputs`), else the one `output`. */
        private fun outputInfos(metadata: ModelMetadata) = metadata.detection?.outputs ?: listOf(metadata.output)

        private fun newOutputBuffers(metadata: ModelMetadata): List<ByteBuffer> =
            outputInfos(metadata).map { ByteBuffer.allocateDirect(it.byteSize).order(ByteOrder.nativeOrder()) }

        /** The map [Interpreter.runForMultipleInputsOutputs] takes, made once per set of buffers. */
        private fun indexed(buffers: List<ByteBuffer>): Map<Int, Any> = buffers.withIndex().associate { it.index to it.value }

        /** Run [interpreter] on [inputs] into [buffers], [byIndex] the same by output index (one output: the plain `run`). */
        private fun runInto(interpreter: Interpreter, inputs: Array<Any>, buffers: List<ByteBuffer>, byIndex: Map<Int, Any>) {
            if (buffers.size == 1) {
                interpreter.run(inputs[0], buffers[0])
            } else {
                interpreter.runForMultipleInputsOutputs(inputs, byIndex)
            }
        }
    }
}
