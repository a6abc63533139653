package androidx.camera.core;

public final class ViewPort {
}
