package android.widget;

import android.graphics.Bitmap;
import android.view.View;

public class ImageView extends View {
    public void setImageBitmap(Bitmap bm) { throw new RuntimeException("Stub!"); }
}
