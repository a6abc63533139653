package android.widget;

import android.view.View;

public class TextView extends View {
    public CharSequence getText() { throw new RuntimeException("Stub!"); }
    public final void setText(CharSequence text) { throw new RuntimeException("Stub!"); }
    public final void setText(int resid) { throw new RuntimeException("Stub!"); }
}
