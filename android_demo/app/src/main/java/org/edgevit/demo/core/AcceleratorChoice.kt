package org.edgevit.demo.core

/** Where LiteRT runs the model. */
enum class Accelerator(val label: String) {
    CPU("CPU (XNNPACK)"),
    GPU("GPU"),
    NNAPI("NNAPI");
}

/** What [AcceleratorChoice.open] opened: the thing, where it runs, and why not where asked. */
data class Opened<T>(val value: T, val requested: Accelerator, val active: Accelerator, val fallbackReason: String?)

/**
 * Open a model on the requested accelerator, falling back to the CPU when the
 * device cannot run it there. [unsupportedReason] is the cheap compatibility
 * check (null when the accelerator may work); [open] does the real work and
 * may still fail (a delegate that rejects the model, a driver error on the
 * first run). Either way the CPU is tried next and the reason is kept to be
 * shown to the user. A CPU failure is the model's fault and propagates.
 */
object AcceleratorChoice {
    fun <T> open(
        requested: Accelerator,
        unsupportedReason: (Accelerator) -> String?,
        open: (Accelerator) -> T,
    ): Opened<T> {
        if (requested == Accelerator.CPU) return Opened(open(Accelerator.CPU), requested, Accelerator.CPU, null)
        val reason = unsupportedReason(requested) ?: try {
            return Opened(open(requested), requested, requested, null)
        } catch (e: Exception) {
            describe(e)
        }
        return Opened(open(Accelerator.CPU), requested, Accelerator.CPU, reason)
    }

    /** A one-line reason from an exception (first line of its message, or its class name). */
    fun describe(e: Throwable): String {
        val message = e.message?.lineSequence()?.firstOrNull { it.isNotBlank() }?.trim()
        return if (message.isNullOrEmpty()) e.javaClass.simpleName else message
    }

    /** Thread counts to offer: 1, 2, 4, ... up to the core count, and the core count itself. */
    fun threadChoices(cores: Int): List<Int> {
        val n = maxOf(1, cores)
        val choices = generateSequence(1) { it * 2 }.takeWhile { it <= n }.toMutableList()
        if (choices.last() != n) choices.add(n)
        return choices
    }
}
