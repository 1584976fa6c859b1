package androidx.work;

import android.content.Context;

/** Stub of androidx.work.ListenableWorker: the context, stop() (the OS ending the work) and Result. */
public abstract class ListenableWorker {
    private final Context context;
    private volatile boolean stopped;

    public ListenableWorker(Context context, WorkerParameters params) { this.context = context; }

    public final Context getApplicationContext() { return context.getApplicationContext(); }
    public final boolean isStopped() { return stopped; }
    /** What WorkManager calls when the constraints stop holding or the OS ends the work. */
    public final void stop() { stopped = true; onStopped(); }
    public void onStopped() {}

    public abstract static class Result {
        private final String kind;
        private final Data output;

        Result(String kind, Data output) { this.kind = kind; this.output = output; }

        public static Result success() { return new Success(new Data.Builder().build()); }
        public static Result success(Data output) { return new Success(output); }
        public static Result failure() { return new Failure(new Data.Builder().build()); }
        public static Result failure(Data output) { return new Failure(output); }
        public static Result retry() { return new Retry(); }

        public Data getOutputData() { return output; }
        @Override public String toString() { return kind; }

        public static final class Success extends Result { Success(Data d) { super("Success", d); } }
        public static final class Failure extends Result { Failure(Data d) { super("Failure", d); } }
        public static final class Retry extends Result { Retry() { super("Retry", new Data.Builder().build()); } }
    }
}
