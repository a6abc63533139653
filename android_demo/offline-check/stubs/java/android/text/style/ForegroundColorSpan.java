package android.text.style;

public class ForegroundColorSpan {
    public ForegroundColorSpan(int color) { throw new RuntimeException("Stub!"); }
}
