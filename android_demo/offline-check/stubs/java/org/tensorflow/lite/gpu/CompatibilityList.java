package org.tensorflow.lite.gpu;

import java.io.Closeable;

public class CompatibilityList implements Closeable {
    public CompatibilityList() { throw new RuntimeException("Stub!"); }
    public boolean isDelegateSupportedOnThisDevice() { throw new RuntimeException("Stub!"); }
    public GpuDelegate.Options getBestOptionsForThisDevice() { throw new RuntimeException("Stub!"); }
    @Override public void close() { throw new RuntimeException("Stub!"); }
}
