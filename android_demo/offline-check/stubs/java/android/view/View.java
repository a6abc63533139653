package android.view;

public class View {
    public static final int VISIBLE = 0x00000000;
    public static final int GONE = 0x00000008;

    public interface OnClickListener {
        void onClick(View v);
    }

    public void setOnClickListener(OnClickListener l) { throw new RuntimeException("Stub!"); }
    public void setVisibility(int visibility) { throw new RuntimeException("Stub!"); }
    public int getVisibility() { throw new RuntimeException("Stub!"); }
    public void setEnabled(boolean enabled) { throw new RuntimeException("Stub!"); }
    public boolean isEnabled() { throw new RuntimeException("Stub!"); }
    public void setAlpha(float alpha) { throw new RuntimeException("Stub!"); }
    public float getAlpha() { throw new RuntimeException("Stub!"); }
    public final int getWidth() { throw new RuntimeException("Stub!"); }
    public final int getHeight() { throw new RuntimeException("Stub!"); }
    public boolean post(Runnable action) { throw new RuntimeException("Stub!"); }
}
