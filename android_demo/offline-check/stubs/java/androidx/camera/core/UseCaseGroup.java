package androidx.camera.core;

public final class UseCaseGroup {
    public static final class Builder {
        public Builder() { throw new RuntimeException("Stub!"); }
        public Builder setViewPort(ViewPort viewPort) { throw new RuntimeException("Stub!"); }
        public Builder addUseCase(UseCase useCase) { throw new RuntimeException("Stub!"); }
        public UseCaseGroup build() { throw new RuntimeException("Stub!"); }
    }
}
