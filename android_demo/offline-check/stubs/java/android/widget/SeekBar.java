package android.widget;

import android.view.View;

public class SeekBar extends View {
    public interface OnSeekBarChangeListener {
        void onProgressChanged(SeekBar seekBar, int progress, boolean fromUser);
        void onStartTrackingTouch(SeekBar seekBar);
        void onStopTrackingTouch(SeekBar seekBar);
    }

    public void setOnSeekBarChangeListener(OnSeekBarChangeListener l) { throw new RuntimeException("Stub!"); }
    public synchronized int getProgress() { throw new RuntimeException("Stub!"); }
}
