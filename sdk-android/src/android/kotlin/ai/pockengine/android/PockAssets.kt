package ai.pockengine.android

import ai.pockengine.ModelBundle
import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockStatus
import ai.pockengine.PockTrainer
import android.content.Context
import java.io.File
import java.io.IOException

/**
 * Model bundles shipped in the app's assets (an AAR from pock-build puts them
 * at assets/pockengine/<name>/).  pock_open reads the weights from a file, so
 * the bundle is copied once into noBackupFilesDir (again after an app update).
 *
 *     val trainer = PockAssets.openTrainer(context, "keyboard")
 */
object PockAssets {
    const val ASSET_ROOT = "pockengine"

    /** The bundle of [model] as a directory, copied out of the assets if needed. */
    @JvmStatic
    fun extract(context: Context, model: String): File {
        val assetDir = "$ASSET_ROOT/$model"
        val names = try {
            context.assets.list(assetDir)?.toList().orEmpty()
        } catch (e: IOException) {
            emptyList()
        }
        if (ModelBundle.MANIFEST !in names) {
            throw PockException(PockStatus.IO, "no model bundle in the app's assets at $assetDir/ (found $names); " +
                "add the AAR from `pock-build --platform android` or copy pock-build's bundle/ there")
        }
        val dir = File(context.noBackupFilesDir, "$ASSET_ROOT/$model")
        val stamp = File(dir, ".installed")
        @Suppress("DEPRECATION")
        val version = context.packageManager.getPackageInfo(context.packageName, 0).lastUpdateTime.toString()
        if (stamp.isFile && stamp.readText() == version) return dir
        dir.mkdirs()
        try {
            copyTree(context, assetDir, dir, names)
            stamp.writeText(version)
        } catch (e: IOException) {
            throw PockException(PockStatus.IO, "cannot copy the model bundle $assetDir to $dir: ${e.message}", e)
        }
        return dir
    }

    /** Copy the asset folder [assetDir] (its [names]) into [dir], recursing into sub-folders such as prefix/. */
    private fun copyTree(context: Context, assetDir: String, dir: File, names: List<String>) {
        dir.mkdirs()
        for (name in names) {
            val children = context.assets.list("$assetDir/$name").orEmpty()
            if (children.isNotEmpty()) {  // a folder (asset folders are never empty)
                copyTree(context, "$assetDir/$name", File(dir, name), children.toList())
                continue
            }
            val tmp = File(dir, ".$name.tmp")
            // fsync before the rename: a crash never leaves a torn file in place, and the copied
            // weights are written back, so once mapped they are clean file-backed pages (not
            // dirty page cache charged to the app) from the first open on
            context.assets.open("$assetDir/$name").use { input ->
                tmp.outputStream().use { out ->
                    input.copyTo(out)
                    out.fd.sync()
                }
            }
            if (!tmp.renameTo(File(dir, name))) throw IOException("cannot rename $tmp")
        }
    }

    /** Open a trainer on the bundled [model] (see [PockTrainer.open]). */
    @JvmStatic
    @JvmOverloads
    fun openTrainer(context: Context, model: String, options: PockOptions = PockOptions()): PockTrainer =
        PockTrainer.open(extract(context, model), options)
}
