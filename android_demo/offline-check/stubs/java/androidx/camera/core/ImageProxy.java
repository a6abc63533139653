package androidx.camera.core;

import android.graphics.Bitmap;

public interface ImageProxy extends AutoCloseable {
    @Override void close();
    ImageInfo getImageInfo();
    Bitmap toBitmap();
}
