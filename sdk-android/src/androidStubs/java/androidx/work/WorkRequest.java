package androidx.work;

/** Stub of androidx.work.WorkRequest. */
public abstract class WorkRequest {}
