package android.content.pm;

/** Stub of android.content.pm.PackageInfo. */
public class PackageInfo {
    public String packageName;
    public long lastUpdateTime;
}
