package androidx.camera.core;

import java.util.concurrent.Executor;

public final class ImageAnalysis extends UseCase {
    public static final int STRATEGY_KEEP_ONLY_LATEST = 0;
    public static final int OUTPUT_IMAGE_FORMAT_RGBA_8888 = 2;

    public interface Analyzer {
        void analyze(ImageProxy image);
    }

    public void setAnalyzer(Executor executor, Analyzer analyzer) { throw new RuntimeException("Stub!"); }

    public static final class Builder {
        public Builder() { throw new RuntimeException("Stub!"); }
        public Builder setBackpressureStrategy(int strategy) { throw new RuntimeException("Stub!"); }
        public Builder setOutputImageFormat(int outputImageFormat) { throw new RuntimeException("Stub!"); }
        public ImageAnalysis build() { throw new RuntimeException("Stub!"); }
    }
}
