package android.graphics;

public class Canvas {
    public Canvas(Bitmap bitmap) { throw new RuntimeException("Stub!"); }
    public void drawRect(float left, float top, float right, float bottom, Paint paint) { throw new RuntimeException("Stub!"); }
    public void drawText(String text, float x, float y, Paint paint) { throw new RuntimeException("Stub!"); }
}
