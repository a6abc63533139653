package org.tensorflow.lite.gpu;

import org.tensorflow.lite.Delegate;

public class GpuDelegate implements Delegate {
    public static final class Options extends GpuDelegateFactory.Options {
    }

    public GpuDelegate(GpuDelegateFactory.Options options) { throw new RuntimeException("Stub!"); }
    @Override public long getNativeHandle() { throw new RuntimeException("Stub!"); }
    @Override public void close() { throw new RuntimeException("Stub!"); }
}
