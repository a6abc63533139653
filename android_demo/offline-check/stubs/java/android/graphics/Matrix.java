package android.graphics;

public class Matrix {
    public Matrix() { throw new RuntimeException("Stub!"); }
    public void setScale(float sx, float sy) { throw new RuntimeException("Stub!"); }
    public boolean postTranslate(float dx, float dy) { throw new RuntimeException("Stub!"); }
}
