package ai.pockengine

import java.io.File
import java.io.IOException
import java.io.InputStream
import java.util.zip.ZipInputStream

/** One compiled input, target or output: its name, shape and dtype (from model.json). */
class TensorSpec(val name: String, shape: IntArray, val dtype: PockDType) {
    private val dims = shape.copyOf()
    val shape: IntArray get() = dims.copyOf()
    val numel: Long get() = dims.fold(1L) { acc, d -> acc * d }
    val nbytes: Long get() = numel * dtype.bytes
    internal fun sameShape(other: IntArray): Boolean = dims.contentEquals(other)
    override fun toString(): String = "$name: ${dtype.manifestName}${PockTensor.shapeString(dims)}"
}

/**
 * A model bundle (toolchain/pockengine/bundle.py): a directory holding
 * `model.json` (this manifest) and the initial weights.  In an AAR it lies
 * under `assets/pockengine/<name>/`.
 */
class ModelBundle private constructor(val dir: File, manifest: Map<String, Any?>, where: String) {
    val name: String = manifest.string("name", where)
    /** The compiled model's structural hash; the native library and checkpoints must match it. */
    val hash: String = manifest.string("hash", where)
    /** The native library's name for System.loadLibrary (`pock_<name>`). */
    val library: String = manifest.string("library", where)
    val weights: File = File(dir, manifest.string("weights", where))
    val inputs: List<TensorSpec> = manifest.tensors("inputs", where)
    val targets: List<TensorSpec> = manifest.tensors("targets", where)
    val outputs: List<TensorSpec> = manifest.tensors("outputs", where)
    /** The frozen prefix's description (manifest "prefix"), or null when the whole model is compiled C++. */
    @Suppress("UNCHECKED_CAST")
    val prefix: Map<String, Any?>? = manifest["prefix"] as Map<String, Any?>?

    companion object {
        const val FORMAT = 1L
        const val MANIFEST = "model.json"

        /** Read and check dir/model.json. */
        @JvmStatic
        fun read(dir: File): ModelBundle {
            val file = File(dir, MANIFEST)
            if (!file.isFile) {
                throw PockException(PockStatus.IO, "$dir is not a PockEngine model bundle (no $MANIFEST)")
            }
            val text = try {
                file.readText()
            } catch (e: IOException) {
                throw PockException(PockStatus.IO, "cannot read $file: ${e.message}", e)
            }
            @Suppress("UNCHECKED_CAST")
            val m = MiniJson.parse(text, file.path) as? Map<String, Any?>
                ?: throw PockException(PockStatus.INVALID_ARGUMENT, "$file: the manifest is not a JSON object")
            if (m["format"] != FORMAT) {
                throw PockException(PockStatus.INVALID_ARGUMENT, "$file: bundle format ${m["format"]}, this SDK reads $FORMAT")
            }
            return ModelBundle(dir, m, file.path)
        }

        /**
         * Unpack a zipped bundle (the files of a bundle directory at the top
         * level of the zip, or in one folder) from [stream] into [dir] and read it.
         * Entries escaping [dir] are rejected.  The stream is not closed.
         */
        @JvmStatic
        fun unzip(stream: InputStream, dir: File): ModelBundle {
            dir.mkdirs()
            val root = dir.canonicalFile
            try {
                val zip = ZipInputStream(stream)
                while (true) {
                    val entry = zip.nextEntry ?: break
                    val target = File(root, entry.name).canonicalFile
                    if (!target.path.startsWith(root.path + File.separator)) {
                        throw PockException(PockStatus.INVALID_ARGUMENT, "bundle zip entry '${entry.name}' escapes $dir")
                    }
                    if (entry.isDirectory) {
                        target.mkdirs()
                        continue
                    }
                    target.parentFile.mkdirs()
                    val tmp = File(target.parentFile, ".${target.name}.tmp")
                    tmp.outputStream().use { out -> zip.copyTo(out) }
                    if (!tmp.renameTo(target)) throw IOException("cannot rename $tmp to $target")
                }
            } catch (e: IOException) {
                throw PockException(PockStatus.IO, "cannot unpack the model bundle into $dir: ${e.message}", e)
            }
            val manifest = root.walkTopDown().maxDepth(2).firstOrNull { it.name == MANIFEST }
                ?: throw PockException(PockStatus.IO, "the bundle stream holds no $MANIFEST")
            return read(manifest.parentFile)
        }

        private fun Map<String, Any?>.string(key: String, where: String): String =
            this[key] as? String ?: throw PockException(PockStatus.INVALID_ARGUMENT, "$where: manifest has no string '$key'")

        private fun Map<String, Any?>.tensors(key: String, where: String): List<TensorSpec> {
            val list = this[key] as? List<*> ?: throw PockException(PockStatus.INVALID_ARGUMENT, "$where: manifest has no list '$key'")
            return list.mapIndexed { i, item ->
                val t = item as? Map<*, *>
                val name = t?.get("name") as? String
                val shape = (t?.get("shape") as? List<*>)?.map { (it as? Long)?.toInt() }
                val dtype = t?.get("dtype") as? String
                if (name == null || shape == null || shape.any { it == null } || dtype == null) {
                    throw PockException(PockStatus.INVALID_ARGUMENT, "$where: $key[$i] needs name, shape and dtype")
                }
                TensorSpec(name, shape.map { it!! }.toIntArray(), PockDType.fromManifest(dtype))
            }
        }
    }
}
