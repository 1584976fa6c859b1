package android.content;

import android.content.pm.PackageManager;
import android.content.res.AssetManager;
import java.io.File;

/** Stub of android.content.Context: the members PockAssets uses. */
public abstract class Context {
    public abstract AssetManager getAssets();
    public abstract File getNoBackupFilesDir();
    public abstract PackageManager getPackageManager();
    public abstract String getPackageName();
    public Context getApplicationContext() { return this; }
}
