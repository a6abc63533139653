package android.graphics;

public class Paint {
    public enum Style {
        FILL, STROKE, FILL_AND_STROKE
    }
    public Paint() { throw new RuntimeException("Stub!"); }
    public void setStyle(Style style) { throw new RuntimeException("Stub!"); }
    public Style getStyle() { throw new RuntimeException("Stub!"); }
    public void setColor(int color) { throw new RuntimeException("Stub!"); }
    public int getColor() { throw new RuntimeException("Stub!"); }
    public void setStrokeWidth(float width) { throw new RuntimeException("Stub!"); }
    public float getStrokeWidth() { throw new RuntimeException("Stub!"); }
    public void setTextSize(float textSize) { throw new RuntimeException("Stub!"); }
    public float getTextSize() { throw new RuntimeException("Stub!"); }
}
