package androidx.work;

/** Stub of androidx.work.Operation. */
public interface Operation {}
