package androidx.work;

/** Stub of androidx.work.Constraints. */
public final class Constraints {
    Constraints() {}

    public static final class Builder {
        public Builder setRequiresCharging(boolean v) { return this; }
        public Builder setRequiresDeviceIdle(boolean v) { return this; }
        public Builder setRequiresBatteryNotLow(boolean v) { return this; }
        public Constraints build() { return new Constraints(); }
    }
}
