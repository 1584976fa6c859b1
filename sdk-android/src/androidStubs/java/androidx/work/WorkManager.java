package androidx.work;

import android.content.Context;

/** Stub of androidx.work.WorkManager. */
public abstract class WorkManager {
    public static WorkManager getInstance(Context context) {
        throw new IllegalStateException("androidx.work stub: WorkManager runs only on a device");
    }

    public abstract Operation enqueueUniquePeriodicWork(String uniqueWorkName,
            ExistingPeriodicWorkPolicy existingPeriodicWorkPolicy, PeriodicWorkRequest periodicWork);
}
