package android.widget;

import android.graphics.Bitmap;
import android.view.View;

public class ImageView extends View {
    public enum ScaleType {
        MATRIX, FIT_XY, FIT_START, FIT_CENTER, FIT_END, CENTER, CENTER_CROP, CENTER_INSIDE
    }

    public void setImageBitmap(Bitmap bm) { throw new RuntimeException("Stub!"); }
    public void setScaleType(ScaleType scaleType) { throw new RuntimeException("Stub!"); }
    public ScaleType getScaleType() { throw new RuntimeException("Stub!"); }
}
