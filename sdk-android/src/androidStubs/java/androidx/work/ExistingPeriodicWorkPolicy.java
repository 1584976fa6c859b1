package androidx.work;

/** Stub of androidx.work.ExistingPeriodicWorkPolicy. */
public enum ExistingPeriodicWorkPolicy { KEEP, REPLACE, UPDATE, CANCEL_AND_REENQUEUE }
