package androidx.camera.core;

import android.graphics.Bitmap;
import android.graphics.Rect;

public interface ImageProxy extends AutoCloseable {
    @Override void close();
    ImageInfo getImageInfo();
    Bitmap toBitmap();
    Rect getCropRect();
}
