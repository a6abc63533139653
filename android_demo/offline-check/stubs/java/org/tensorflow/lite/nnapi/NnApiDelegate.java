package org.tensorflow.lite.nnapi;

import org.tensorflow.lite.Delegate;

public class NnApiDelegate implements Delegate, AutoCloseable {
    public NnApiDelegate() { throw new RuntimeException("Stub!"); }
    @Override public long getNativeHandle() { throw new RuntimeException("Stub!"); }
    @Override public void close() { throw new RuntimeException("Stub!"); }
}
