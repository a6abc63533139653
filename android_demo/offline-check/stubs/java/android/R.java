package android;

public final class R {
    public static final class layout {
        public static final int simple_spinner_dropdown_item = 0x01090009;
        public static final int simple_spinner_item = 0x01090008;
    }
}
