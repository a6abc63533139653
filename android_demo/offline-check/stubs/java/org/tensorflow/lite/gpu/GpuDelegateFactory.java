package org.tensorflow.lite.gpu;

public class GpuDelegateFactory {
    public static class Options {
    }
}
