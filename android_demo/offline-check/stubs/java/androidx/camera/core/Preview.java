package androidx.camera.core;

public final class Preview extends UseCase {
    public interface SurfaceProvider {
    }

    public void setSurfaceProvider(SurfaceProvider surfaceProvider) { throw new RuntimeException("Stub!"); }

    public static final class Builder {
        public Builder() { throw new RuntimeException("Stub!"); }
        public Preview build() { throw new RuntimeException("Stub!"); }
    }
}
