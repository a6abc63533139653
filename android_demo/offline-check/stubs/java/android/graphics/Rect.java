package android.graphics;

public final class Rect {
    public int left;
    public int top;
    public int right;
    public int bottom;
}
