package androidx.work;

import java.util.concurrent.TimeUnit;

/** Stub of androidx.work.PeriodicWorkRequest. */
public final class PeriodicWorkRequest extends WorkRequest {
    PeriodicWorkRequest() {}

    public static final class Builder {
        public Builder(Class<? extends ListenableWorker> workerClass, long repeatInterval, TimeUnit repeatIntervalTimeUnit) {}
        public Builder setConstraints(Constraints constraints) { return this; }
        public PeriodicWorkRequest build() { return new PeriodicWorkRequest(); }
    }
}
