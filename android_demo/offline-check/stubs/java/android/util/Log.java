package android.util;

public final class Log {
    public static int e(String tag, String msg, Throwable tr) { throw new RuntimeException("Stub!"); }
}
