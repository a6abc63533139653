package android.widget;

import android.graphics.Bitmap;
import android.graphics.Matrix;
import android.view.View;

public class ImageView extends View {
    public void setImageBitmap(Bitmap bm) { throw new RuntimeException("Stub!"); }
    public void setImageMatrix(Matrix matrix) { throw new RuntimeException("Stub!"); }
    public Matrix getImageMatrix() { throw new RuntimeException("Stub!"); }
}
