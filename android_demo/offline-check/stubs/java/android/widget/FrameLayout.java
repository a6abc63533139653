package android.widget;

import android.view.ViewGroup;

public class FrameLayout extends ViewGroup {
}
