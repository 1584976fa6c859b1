package android.content.res;

import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;

/** Stub of android.content.res.AssetManager over a directory (the APK's assets/). */
public final class AssetManager {
    private final File root;

    public AssetManager(File root) { this.root = root; }

    /** The names in an asset folder; an empty array for a file or a missing path (as Android). */
    public String[] list(String path) throws IOException {
        String[] names = new File(root, path).list();
        if (names == null) return new String[0];
        java.util.Arrays.sort(names);
        return names;
    }

    public InputStream open(String fileName) throws IOException {
        return new FileInputStream(new File(root, fileName));
    }
}
