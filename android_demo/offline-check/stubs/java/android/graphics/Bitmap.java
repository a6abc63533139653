package android.graphics;

public final class Bitmap {
    public enum Config {
        ALPHA_8, RGB_565, ARGB_4444, ARGB_8888, RGBA_F16, HARDWARE, RGBA_1010102
    }

    public final int getWidth() { throw new RuntimeException("Stub!"); }
    public final int getHeight() { throw new RuntimeException("Stub!"); }
    public void getPixels(int[] pixels, int offset, int stride, int x, int y, int width, int height) { throw new RuntimeException("Stub!"); }
    public void eraseColor(int c) { throw new RuntimeException("Stub!"); }
    public void setPixels(int[] pixels, int offset, int stride, int x, int y, int width, int height) { throw new RuntimeException("Stub!"); }
    public static Bitmap createBitmap(int[] colors, int width, int height, Config config) { throw new RuntimeException("Stub!"); }
    public static Bitmap createBitmap(int width, int height, Config config) { throw new RuntimeException("Stub!"); }
}
