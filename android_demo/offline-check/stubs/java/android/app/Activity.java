package android.app;

import android.content.ContentResolver;
import android.content.Context;
import android.content.res.AssetManager;
import android.os.Bundle;
import android.view.View;

// Really ContextThemeWrapper -> ContextWrapper -> Context; the wrappers add nothing the app uses.
public class Activity extends Context {
    public Activity() { throw new RuntimeException("Stub!"); }
    protected void onCreate(Bundle savedInstanceState) { throw new RuntimeException("Stub!"); }
    protected void onDestroy() { throw new RuntimeException("Stub!"); }
    public void setContentView(int layoutResID) { throw new RuntimeException("Stub!"); }
    public <T extends View> T findViewById(int id) { throw new RuntimeException("Stub!"); }
    public final void runOnUiThread(Runnable action) { throw new RuntimeException("Stub!"); }
    @Override public AssetManager getAssets() { throw new RuntimeException("Stub!"); }
    @Override public ContentResolver getContentResolver() { throw new RuntimeException("Stub!"); }
    @Override public int checkSelfPermission(String permission) { throw new RuntimeException("Stub!"); }
}
