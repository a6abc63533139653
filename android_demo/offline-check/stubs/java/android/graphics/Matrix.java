package android.graphics;

public class Matrix {
    public Matrix() { throw new RuntimeException("Stub!"); }
    public boolean postRotate(float degrees) { throw new RuntimeException("Stub!"); }
}
