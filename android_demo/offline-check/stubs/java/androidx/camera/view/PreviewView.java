package androidx.camera.view;

import android.widget.FrameLayout;
import androidx.camera.core.Preview;

public final class PreviewView extends FrameLayout {
    public Preview.SurfaceProvider getSurfaceProvider() { throw new RuntimeException("Stub!"); }
}
