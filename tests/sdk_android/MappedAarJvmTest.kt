// An AAR's model bundle on the JVM with its frozen weights mapped, driven by test_mapped_aar.py:
// the AAR's assets/ are packed as an app's build packs them (into the APK's assets, here a
// directory under the android stubs' AssetManager), PockAssets copies the bundle out once and
// PockTrainer opens its checkpoint by path, which pock_open maps.  After training, the weights
// file's pages in /proc/self/smaps of this JVM are clean file-backed ones (only the trained
// tensors and their optimizer state were copied on write), and the frozen tensors are unchanged.
//
//   java -cp core:android:stubs:this:stdlib:coroutines MappedAarJvmTestKt AAR MODEL LIBRARY BATCH FROZEN WORK TRAINED
//
// BATCH: x (f32) then y (i64), native order; FROZEN: the frozen parameters' names, comma-separated;
// TRAINED: a trained parameter's name.
// Prints one "key value" line per fact; exits 1 on an unexpected exception.
import ai.pockengine.PockOptions
import ai.pockengine.PockTensor
import ai.pockengine.PockTrainer
import ai.pockengine.android.PockAssets
import android.content.Context
import android.content.pm.PackageInfo
import android.content.pm.PackageManager
import android.content.res.AssetManager
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.util.zip.ZipFile

const val MAPPED_STEPS = 5

fun fact(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

class AssetsContext(private val assetsDir: File, private val noBackup: File) : Context() {
    override fun getAssets() = AssetManager(assetsDir)
    override fun getNoBackupFilesDir() = noBackup
    override fun getPackageName() = "ai.pockengine.mappedtest"
    override fun getPackageManager(): PackageManager = object : PackageManager() {
        override fun getPackageInfo(packageName: String, flags: Int) = PackageInfo().also { it.lastUpdateTime = 1L }
    }
}

/**
 * Rss, Private_Dirty, clean (Private_Clean + Shared_Clean) and Anonymous kB of [file]'s mappings in
 * /proc/self/smaps.  Anonymous counts the pages copied on write (what the app is charged for); a
 * file page the copy-out wrote and the OS has not written back yet counts as dirty but is no copy.
 */
fun filePages(file: File): LongArray {
    val path = file.canonicalPath
    val out = LongArray(4)
    var inside = false
    for (line in File("/proc/self/smaps").readLines()) {
        val head = line.substringBefore(' ')
        if (head.contains('-') && !head.endsWith(':')) {  // a mapping's header: "start-end perms offset dev inode path"
            inside = line.substringAfter('/', "").let { it.isNotEmpty() && "/$it" == path }
            continue
        }
        if (!inside) continue
        val kb = line.substringAfter(':').trim().removeSuffix(" kB").trim().toLongOrNull() ?: continue
        when (line.substringBefore(':')) {
            "Rss" -> out[0] += kb
            "Private_Dirty" -> out[1] += kb
            "Private_Clean", "Shared_Clean" -> out[2] += kb
            "Anonymous" -> out[3] += kb
        }
    }
    return out
}

fun main(args: Array<String>) {
    val aar = File(args[0])
    val model = args[1]
    val library = File(args[2])
    val batch = File(args[3]).readBytes()
    val frozen = args[4].split(',')
    val work = File(args[5])

    // the app's build: the AAR's assets/ into the APK's assets
    val assets = File(work, "apk/assets")
    ZipFile(aar).use { zip ->
        for (entry in zip.entries()) {
            if (entry.isDirectory || !entry.name.startsWith("assets/")) continue
            val target = File(assets, entry.name.removePrefix("assets/"))
            target.parentFile.mkdirs()
            zip.getInputStream(entry).use { input -> target.outputStream().use { input.copyTo(it) } }
        }
    }
    val context = AssetsContext(assets, File(work, "nobackup"))
    val dir = PockAssets.extract(context, model)
    val weights = File(dir, "weights.pockckpt")
    fact("weights_file", weights.canonicalPath)

    PockAssets.openTrainer(context, model, PockOptions(libraryFile = library, numThreads = 1)).use { t ->
        val xSpec = t.inputs[0]
        val ySpec = t.targets[0]
        val xn = xSpec.shape.fold(1) { a, b -> a * b }
        val buf = ByteBuffer.wrap(batch).order(ByteOrder.nativeOrder())
        val x = FloatArray(xn) { buf.getFloat() }
        val y = LongArray(ySpec.shape.fold(1) { a, b -> a * b }) { buf.getLong() }
        val xt = PockTensor.of(x, *xSpec.shape)
        val yt = PockTensor.of(y, *ySpec.shape)
        val before = frozen.associateWith { t.getTensor(it).toByteArray().toList() }
        val trainedBefore = t.getTensor(args[6]).toByteArray().toList()
        val opened = filePages(weights)
        fact("open_ckpt_anon_kb", opened[3])
        fact("losses", FloatArray(MAPPED_STEPS) { t.step(xt, yt) }.joinToString(" "))
        val trained = filePages(weights)
        fact("ckpt_rss_kb", trained[0])
        fact("ckpt_dirty_kb", trained[1])
        fact("ckpt_clean_kb", trained[2])
        fact("ckpt_anon_kb", trained[3])
        fact("frozen_identical", frozen.all { t.getTensor(it).toByteArray().toList() == before[it] })
        fact("trained_changed", t.getTensor(args[6]).toByteArray().toList() != trainedBefore)
        t.save(File(work, "kt_after.pockckpt"))
    }
    fact("done", true)
}
