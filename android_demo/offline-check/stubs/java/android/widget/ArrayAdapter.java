package android.widget;

import android.content.Context;
import java.util.List;

public class ArrayAdapter<T> implements SpinnerAdapter {
    public ArrayAdapter(Context context, int resource, List<T> objects) { throw new RuntimeException("Stub!"); }
    public void setDropDownViewResource(int resource) { throw new RuntimeException("Stub!"); }
}
