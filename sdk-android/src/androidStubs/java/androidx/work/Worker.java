package androidx.work;

import android.content.Context;

/** Stub of androidx.work.Worker: doWork() runs synchronously on WorkManager's executor. */
public abstract class Worker extends ListenableWorker {
    public Worker(Context context, WorkerParameters params) { super(context, params); }

    public abstract Result doWork();
}
