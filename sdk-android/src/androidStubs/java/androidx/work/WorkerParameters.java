package androidx.work;

/** Stub of androidx.work.WorkerParameters (WorkManager builds it; tests use the public constructor). */
public final class WorkerParameters {
    public WorkerParameters() {}
}
