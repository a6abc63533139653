package androidx.lifecycle;

// The app only passes its activity to CameraX as a LifecycleOwner.
public interface LifecycleOwner {
}
