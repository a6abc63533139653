package android.widget;

import android.view.View;
import android.view.ViewGroup;

public abstract class AdapterView<T extends Adapter> extends ViewGroup {
    public interface OnItemSelectedListener {
        void onItemSelected(AdapterView<?> parent, View view, int position, long id);
        void onNothingSelected(AdapterView<?> parent);
    }

    public void setOnItemSelectedListener(OnItemSelectedListener listener) { throw new RuntimeException("Stub!"); }
    public final OnItemSelectedListener getOnItemSelectedListener() { throw new RuntimeException("Stub!"); }
}
