package android.widget;

public abstract class AbsSpinner extends AdapterView<SpinnerAdapter> {
    public SpinnerAdapter getAdapter() { throw new RuntimeException("Stub!"); }
    public void setAdapter(SpinnerAdapter adapter) { throw new RuntimeException("Stub!"); }
    public void setSelection(int position, boolean animate) { throw new RuntimeException("Stub!"); }
}
