package org.tensorflow.lite;

public interface Tensor {
    DataType dataType();
    int[] shape();
}
