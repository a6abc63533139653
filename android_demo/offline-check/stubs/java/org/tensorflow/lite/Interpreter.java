package org.tensorflow.lite;

import java.nio.ByteBuffer;
import java.util.Map;

// Really implements InterpreterApi, where run/getInputTensor/getOutputTensor/close are declared.
public final class Interpreter implements AutoCloseable {
    public static class Options {
        public Options() { throw new RuntimeException("Stub!"); }
        public Options setNumThreads(int numThreads) { throw new RuntimeException("Stub!"); }
        public Options addDelegate(Delegate delegate) { throw new RuntimeException("Stub!"); }
    }

    public Interpreter(ByteBuffer byteBuffer, Options options) { throw new RuntimeException("Stub!"); }
    public void run(Object input, Object output) { throw new RuntimeException("Stub!"); }
    public void runForMultipleInputsOutputs(Object[] inputs, Map<Integer, Object> outputs) { throw new RuntimeException("Stub!"); }
    public int getOutputTensorCount() { throw new RuntimeException("Stub!"); }
    public Tensor getInputTensor(int inputIndex) { throw new RuntimeException("Stub!"); }
    public Tensor getOutputTensor(int outputIndex) { throw new RuntimeException("Stub!"); }
    @Override public void close() { throw new RuntimeException("Stub!"); }
}
