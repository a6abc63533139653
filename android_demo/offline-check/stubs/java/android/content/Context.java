package android.content;

import android.content.res.AssetManager;

public abstract class Context {
    public abstract AssetManager getAssets();
    public abstract ContentResolver getContentResolver();
    public final String getString(int resId) { throw new RuntimeException("Stub!"); }
    public final String getString(int resId, Object... formatArgs) { throw new RuntimeException("Stub!"); }
    public abstract int checkSelfPermission(String permission);
}
