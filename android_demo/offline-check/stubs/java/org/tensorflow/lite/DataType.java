package org.tensorflow.lite;

public enum DataType {
    FLOAT32, INT32, UINT8, INT64, STRING, BOOL, INT16, INT8
}
