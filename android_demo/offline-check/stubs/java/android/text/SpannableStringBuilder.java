package android.text;

public class SpannableStringBuilder implements CharSequence, Spanned {
    public SpannableStringBuilder() { throw new RuntimeException("Stub!"); }
    public SpannableStringBuilder append(CharSequence text) { throw new RuntimeException("Stub!"); }
    public void setSpan(Object what, int start, int end, int flags) { throw new RuntimeException("Stub!"); }
    public int length() { throw new RuntimeException("Stub!"); }
    public char charAt(int where) { throw new RuntimeException("Stub!"); }
    public CharSequence subSequence(int start, int end) { throw new RuntimeException("Stub!"); }
}
