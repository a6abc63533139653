package org.edgevit.demo.core

import java.math.BigDecimal
import java.math.RoundingMode
import java.nio.ByteBuffer
import java.security.MessageDigest
import java.util.concurrent.ConcurrentHashMap
import kotlin.math.sqrt

/** Where the check of the GPU's outputs against the CPU's stands for the loaded model. */
enum class GpuCheckState {
    /** The model does not run on the GPU: CPU or NNAPI asked for, or the GPU could not be used. */
    NOT_NEEDED,

    /** Runs on the GPU; the first frame will also run on the CPU to compare. */
    UNVERIFIED,

    /** The first frame is running on both. */
    VERIFYING,

    /** The GPU's output matched the CPU's: the model stays on the GPU. */
    VERIFIED,

    /** The GPU's output did not match: the model runs on the CPU. */
    REJECTED,
}

/** A line for the user about where the model runs; warnings are shown in the warning colour. */
data class Notice(val text: String, val isWarning: Boolean)

/**
 * How far the GPU's output for one input follows the CPU's: the cosine similarity of the two
 * dequantized output vectors, or the [problem] that makes a cosine meaningless (NaN / Inf values,
 * an all-zero output against a non-zero one). The CPU (XNNPACK) result is the reference: it is
 * what edgevit validated the converted model with.
 */
data class OutputAgreement(val cosine: Double, val problem: String? = null) {
    val agrees: Boolean get() = problem == null && cosine >= MIN_COSINE

    /** The evidence in a few words: "cosine 0.87", or the problem. */
    val detail: String get() = problem ?: "cosine ${formatCosine(cosine)}"

    companion object {
        /**
         * A correct GPU run differs from the CPU only by fp16 arithmetic and int8 rounding, which keeps
         * the cosine of whole logit vectors near 1; a miscompiled kernel moves it far below this.
         */
        const val MIN_COSINE = 0.99

        fun of(gpu: FloatArray, cpu: FloatArray): OutputAgreement {
            require(gpu.size == cpu.size) { "the GPU output has ${gpu.size} values, the CPU output ${cpu.size}" }
            if (gpu.any { !it.isFinite() }) return OutputAgreement(Double.NaN, "GPU output has NaN or Inf")
            if (cpu.any { !it.isFinite() }) return OutputAgreement(Double.NaN, "CPU output has NaN or Inf")
            var dot = 0.0
            var gpuSquares = 0.0
            var cpuSquares = 0.0
            for (i in gpu.indices) {
                val g = gpu[i].toDouble()
                val c = cpu[i].toDouble()
                dot += g * c
                gpuSquares += g * g
                cpuSquares += c * c
            }
            return when {
                gpuSquares == 0.0 && cpuSquares == 0.0 -> OutputAgreement(1.0)
                gpuSquares == 0.0 -> OutputAgreement(0.0, "GPU output is all zeros")
                cpuSquares == 0.0 -> OutputAgreement(0.0, "CPU output is all zeros")
                else -> OutputAgreement((dot / (sqrt(gpuSquares) * sqrt(cpuSquares))).coerceIn(-1.0, 1.0))
            }
        }

        /**
         * Five decimals at most, two at least, rounded down: a rejected 0.989999 must not read as 0.99,
         * nor an inexact match as 1.00.
         */
        fun formatCosine(cosine: Double): String {
            val rounded = BigDecimal.valueOf(cosine).setScale(5, RoundingMode.FLOOR).stripTrailingZeros()
            return rounded.setScale(maxOf(2, rounded.scale())).toPlainString()
        }
    }
}

/**
 * GPU check outcomes per model file. One instance lives as long as the app's process, so a model is
 * checked once per launch rather than on every load; a new launch checks again, since a system or
 * GPU driver update can change the answer.
 */
class GpuVerdicts {
    private val byModel = ConcurrentHashMap<String, OutputAgreement>()

    operator fun get(modelKey: String): OutputAgreement? = byModel[modelKey]

    fun remember(modelKey: String, agreement: OutputAgreement) {
        byModel[modelKey] = agreement
    }

    companion object {
        /** A model file's identity is its content, so a different model bundled under the same name is checked anew. */
        fun modelKey(model: ByteArray): String =
            MessageDigest.getInstance("SHA-256").digest(model).joinToString("") { "%02x".format(it) }
    }
}

/**
 * Some phone GPU drivers compute wrong outputs for some graphs while LiteRT reports every op
 * delegated, so the GPU is trusted for a model only once its output for a real frame matched the
 * CPU's. [open] decides where a model opens and what the user is told; on the GPU the first frame
 * runs on both ([begin], then [finish]), and a mismatch moves the model to the CPU ([active]). The
 * outcome is remembered in [GpuVerdicts] for the model file, so later loads skip the check, and a
 * rejected GPU is not even opened again.
 */
class GpuCheck private constructor(
    private val verdicts: GpuVerdicts,
    private val modelKey: String,
    val requested: Accelerator,
    active: Accelerator,
    state: GpuCheckState,
    notice: Notice?,
) {
    /** Where the model runs now. */
    var active: Accelerator = active
        private set

    var state: GpuCheckState = state
        private set

    /** What to show about where the model runs; null when there is nothing to say. */
    var notice: Notice? = notice
        private set

    /** The first frame on the GPU starts the check: run it on the CPU too, then call [finish]. */
    fun begin() {
        check(state == GpuCheckState.UNVERIFIED) { "the GPU check cannot begin in state $state" }
        state = GpuCheckState.VERIFYING
    }

    /**
     * Compare the GPU's and the CPU's raw output tensors for the same input, both read from their
     * position and dequantized as [output] describes (int8 zero points would otherwise count as signal).
     */
    fun finish(gpuOutput: ByteBuffer, cpuOutput: ByteBuffer, output: TensorInfo): OutputAgreement =
        finish(listOf(gpuOutput), listOf(cpuOutput), listOf(output))

    /**
     * The same for a model with several outputs (a detector's boxes and scores), each compared on its
     * own: the GPU agrees when every output does; the verdict is the first that does not, else the
     * lowest cosine.
     */
    fun finish(gpuOutputs: List<ByteBuffer>, cpuOutputs: List<ByteBuffer>, outputs: List<TensorInfo>): OutputAgreement {
        check(state == GpuCheckState.VERIFYING) { "the GPU check cannot finish in state $state" }
        val each = outputs.indices.map {
            OutputAgreement.of(Postprocessor.scores(gpuOutputs[it], outputs[it]), Postprocessor.scores(cpuOutputs[it], outputs[it]))
        }
        val agreement = each.firstOrNull { !it.agrees } ?: each.minBy { it.cosine }
        verdicts.remember(modelKey, agreement)
        if (agreement.agrees) {
            state = GpuCheckState.VERIFIED
            notice = Notice("GPU verified against CPU (${agreement.detail})", isWarning = false)
        } else {
            state = GpuCheckState.REJECTED
            active = Accelerator.CPU
            notice = Notice("GPU results differ from CPU (${agreement.detail}): using CPU", isWarning = true)
        }
        return agreement
    }

    companion object {
        /**
         * Open a model with [AcceleratorChoice.open] (compatibility check, CPU fallback with the reason),
         * except that a GPU an earlier check rejected for this model file is not opened: the CPU is.
         * Returns what [open] opened and the check that goes with it.
         */
        fun <T> open(
            requested: Accelerator,
            modelKey: String,
            verdicts: GpuVerdicts,
            unsupportedReason: (Accelerator) -> String?,
            open: (Accelerator) -> T,
        ): Pair<T, GpuCheck> {
            fun checkOf(active: Accelerator, state: GpuCheckState, notice: Notice?) =
                GpuCheck(verdicts, modelKey, requested, active, state, notice)

            val remembered = verdicts[modelKey]
            if (requested == Accelerator.GPU && remembered?.agrees == false) {
                val notice = Notice(
                    "GPU results differed from CPU on an earlier check (${remembered.detail}): using CPU",
                    isWarning = true,
                )
                return open(Accelerator.CPU) to checkOf(Accelerator.CPU, GpuCheckState.REJECTED, notice)
            }
            val opened = AcceleratorChoice.open(requested, unsupportedReason, open)
            val check = when {
                opened.fallbackReason != null -> {
                    val why = "${requested.label} unavailable (${opened.fallbackReason}): running on CPU"
                    checkOf(opened.active, GpuCheckState.NOT_NEEDED, Notice(why, isWarning = true))
                }
                opened.active != Accelerator.GPU -> checkOf(opened.active, GpuCheckState.NOT_NEEDED, null)
                // Agreement was already said when it was found: no need to repeat it on every reload.
                remembered != null -> checkOf(Accelerator.GPU, GpuCheckState.VERIFIED, null)
                else -> checkOf(
                    Accelerator.GPU, GpuCheckState.UNVERIFIED,
                    Notice("Checking GPU results against CPU on the first frame…", isWarning = false),
                )
            }
            return opened.value to check
        }
    }
}
