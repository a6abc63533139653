// Stubs of the androidx.activity API the app uses (a Kotlin library, so stubbed
// in Kotlin: its objects and top-level functions are called the Kotlin way).
@file:Suppress("UNUSED_PARAMETER", "unused")

package androidx.activity

import androidx.activity.result.ActivityResultCallback
import androidx.activity.result.ActivityResultLauncher
import androidx.activity.result.contract.ActivityResultContract
import androidx.lifecycle.LifecycleOwner

open class ComponentActivity : android.app.Activity(), LifecycleOwner {
    fun <I, O> registerForActivityResult(
        contract: ActivityResultContract<I, O>,
        callback: ActivityResultCallback<O>,
    ): ActivityResultLauncher<I> = throw RuntimeException("Stub!")
}
