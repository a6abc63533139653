package android.widget;

public class Spinner extends AbsSpinner {
    @Override public void setAdapter(SpinnerAdapter adapter) { throw new RuntimeException("Stub!"); }
}
