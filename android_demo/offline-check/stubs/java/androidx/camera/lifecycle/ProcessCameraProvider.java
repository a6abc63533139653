package androidx.camera.lifecycle;

import android.content.Context;
import androidx.camera.core.Camera;
import androidx.camera.core.CameraSelector;
import androidx.camera.core.UseCaseGroup;
import androidx.lifecycle.LifecycleOwner;
import com.google.common.util.concurrent.ListenableFuture;

public final class ProcessCameraProvider {
    public static ListenableFuture<ProcessCameraProvider> getInstance(Context context) { throw new RuntimeException("Stub!"); }
    public Camera bindToLifecycle(LifecycleOwner lifecycleOwner, CameraSelector cameraSelector, UseCaseGroup useCaseGroup) { throw new RuntimeException("Stub!"); }
    public void unbindAll() { throw new RuntimeException("Stub!"); }
}
