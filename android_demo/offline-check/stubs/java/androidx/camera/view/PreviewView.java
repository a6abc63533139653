package androidx.camera.view;

import android.widget.FrameLayout;
import androidx.camera.core.Preview;
import androidx.camera.core.ViewPort;

public final class PreviewView extends FrameLayout {
    public Preview.SurfaceProvider getSurfaceProvider() { throw new RuntimeException("Stub!"); }
    public ViewPort getViewPort() { throw new RuntimeException("Stub!"); }
}
