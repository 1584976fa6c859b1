package android.content.pm;

/** Stub of android.content.pm.PackageManager. */
public abstract class PackageManager {
    public static class NameNotFoundException extends Exception {
        public NameNotFoundException(String name) { super(name); }
    }

    public abstract PackageInfo getPackageInfo(String packageName, int flags) throws NameNotFoundException;
}
