package org.tensorflow.lite;

import java.io.Closeable;

public interface Delegate extends Closeable {
    long getNativeHandle();
    @Override default void close() {}
}
