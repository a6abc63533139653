package android.graphics;

import java.io.InputStream;

public class BitmapFactory {
    public static class Options {
        public boolean inJustDecodeBounds;
        public int inSampleSize;
        public int outWidth;
        public int outHeight;
    }

    public static Bitmap decodeStream(InputStream is, Rect outPadding, Options opts) { throw new RuntimeException("Stub!"); }
}
