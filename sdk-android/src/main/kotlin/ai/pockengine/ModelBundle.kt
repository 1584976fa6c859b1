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
 * A model bundle (toolchain/pockengine/runtime/bundle.py): a directory holding
 * `model.json` (this manifest) and the initial weights.  In an AAR it lies
 * under `assets/pockengine/<name>/`.
 */
class ModelBundle private constructor(val dir: File, manifest: Map<String, Any?>, where: String) {
    val name: String = manifest.string("name", where)
    /** The compiled model's structural hash; the native library and checkpoints must match it. */
    val hash: String = manifest.string("hash", where)
    /** The native library's name for System.loadLibrary (`pock_<name>`). */
    val library: String = manifest.string("library", where)
    val weights: File = inside(dir, manifest.string("weights", where), "weights", where)
    val inputs: List<TensorSpec> = manifest.tensors("inputs", where)
    val targets: List<TensorSpec> = manifest.tensors("targets", where)
    val outputs: List<TensorSpec> = manifest.tensors("outputs", where)
    /** The frozen prefix's description (manifest "prefix"), or null when the whole model is compiled C++. */
    val prefix: Map<String, Any?>? = manifest.prefix(dir, where)
    private val where = where

    /**
     * Check the manifest's inputs, targets and outputs against what the loaded
     * library reports (pock_io_info, the truth): the same count, dtypes and
     * shapes, so no buffer is ever sized from a manifest the library disagrees with.
     */
    internal fun checkAgainstLibrary(info: (group: Int, index: Int) -> LongArray?) {
        for ((group, key, specs) in listOf(Triple(0, "inputs", inputs), Triple(1, "targets", targets),
                                           Triple(2, "outputs", outputs))) {
            val count = generateSequence(0) { it + 1 }.takeWhile { info(group, it) != null }.count()
            if (count != specs.size) bad(where, key, "lists ${specs.size} tensors; the library '$library' has $count")
            specs.forEachIndexed { i, spec ->
                val got = info(group, i)!!  // [dtype code, ndim, dims...]
                val dims = IntArray(got[1].toInt()) { got[2 + it].toInt() }
                if (got[0].toInt() != spec.dtype.code || !spec.sameShape(dims)) {
                    bad(where, "$key[$i]", "is $spec; the library '$library' computes " +
                        "${PockDType.values().firstOrNull { it.code == got[0].toInt() }?.manifestName ?: "dtype ${got[0]}"}" +
                        PockTensor.shapeString(dims))
                }
            }
        }
    }

    companion object {
        const val FORMAT = 1L
        const val MANIFEST = "model.json"

        /** The largest model.json read, the most dims a tensor has (POCK_MAX_DIMS), the most tensors per list. */
        const val MAX_MANIFEST_BYTES = 4L shl 20
        const val MAX_DIMS = 8
        const val MAX_TENSORS = 4096
        /** The most bytes one tensor may hold: what one Java array can. */
        const val MAX_TENSOR_BYTES = Int.MAX_VALUE.toLong() - 8

        /**
         * Read and check dir/model.json: every field of the schema with its exact
         * type and bounds (see [checkManifest]); a violation is a [PockException]
         * naming the field.
         */
        @JvmStatic
        fun read(dir: File): ModelBundle {
            val file = File(dir, MANIFEST)
            if (!file.isFile) {
                throw PockException(PockStatus.IO, "$dir is not a PockEngine model bundle (no $MANIFEST)")
            }
            if (file.length() > MAX_MANIFEST_BYTES) {
                throw PockException(PockStatus.INVALID_ARGUMENT, "$file: ${file.length()} bytes, more than a manifest " +
                    "may hold ($MAX_MANIFEST_BYTES)")
            }
            val text = try {
                file.readText()
            } catch (e: IOException) {
                throw PockException(PockStatus.IO, "cannot read $file: ${e.message}", e)
            }
            return parse(text, dir, file.path)
        }

        /** [read] on manifest text already in memory (`where` names it in messages): the fuzz target. */
        @JvmStatic
        fun parse(text: String, dir: File, where: String): ModelBundle {
            @Suppress("UNCHECKED_CAST")
            val m = MiniJson.parse(text, where) as? Map<String, Any?>
                ?: throw PockException(PockStatus.INVALID_ARGUMENT, "$where: the manifest is not a JSON object")
            if (m["format"] != FORMAT) {
                throw PockException(PockStatus.INVALID_ARGUMENT, "$where: bundle format ${m["format"]}, this SDK reads $FORMAT")
            }
            return ModelBundle(dir, m, where)
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

        private fun bad(where: String, field: String, why: String): Nothing =
            throw PockException(PockStatus.INVALID_ARGUMENT, "$where: manifest field '$field' $why")

        private fun typeName(v: Any?): String = when (v) {
            null -> "null"
            is String -> "a string"
            is Long, is Double -> "a number"
            is Boolean -> "a boolean"
            is List<*> -> "a list"
            is Map<*, *> -> "an object"
            else -> v.javaClass.simpleName
        }

        private fun Map<String, Any?>.string(key: String, where: String): String {
            val v = this[key] as? String ?: bad(where, key, "must be a string, got ${typeName(this[key])}")
            if (v.isEmpty() || v.length > 4096 || v.any { it == '\u0000' }) bad(where, key, "must be a non-empty string")
            return v
        }

        /** dir/[path] when [path] is relative, has no `..` and resolves (symlinks too) inside [dir]. */
        private fun inside(dir: File, path: String, field: String, where: String): File {
            if (path.startsWith("/") || path.startsWith("\\") || File(path).isAbsolute || path.contains('\\') ||
                path.split('/').any { it == ".." }) {
                bad(where, field, "('$path') must name a file inside the bundle (a relative path without '..')")
            }
            val root = dir.canonicalFile
            val file = File(dir, path)
            val real = try { file.canonicalFile } catch (e: IOException) { bad(where, field, "('$path') cannot be resolved") }
            if (!real.path.startsWith(root.path + File.separator)) {
                bad(where, field, "('$path') resolves to $real, outside the bundle $root")
            }
            return file
        }

        private fun Map<String, Any?>.tensors(key: String, where: String): List<TensorSpec> {
            val list = this[key] as? List<*> ?: bad(where, key, "must be a list, got ${typeName(this[key])}")
            if (list.size > MAX_TENSORS) bad(where, key, "lists ${list.size} tensors, more than $MAX_TENSORS")
            return list.mapIndexed { i, item ->
                val field = "$key[$i]"
                val t = item as? Map<*, *> ?: bad(where, field, "must be an object, got ${typeName(item)}")
                val name = t["name"] as? String ?: bad(where, "$field.name", "must be a string, got ${typeName(t["name"])}")
                val dtypeName = t["dtype"] as? String ?: bad(where, "$field.dtype", "must be a string, got ${typeName(t["dtype"])}")
                val dtype = PockDType.values().firstOrNull { it.manifestName == dtypeName }
                    ?: bad(where, "$field.dtype", "is '$dtypeName', which this SDK does not know")
                val shape = t["shape"] as? List<*> ?: bad(where, "$field.shape", "must be a list, got ${typeName(t["shape"])}")
                if (shape.size > MAX_DIMS) bad(where, "$field.shape", "has ${shape.size} dims, more than $MAX_DIMS")
                var bytes = dtype.bytes.toLong()
                val dims = IntArray(shape.size) { d ->
                    val v = shape[d] as? Long ?: bad(where, "$field.shape[$d]", "must be an integer, got ${typeName(shape[d])}")
                    if (v < 0) bad(where, "$field.shape[$d]", "is $v; a dimension must be >= 0")
                    if (v > Int.MAX_VALUE) bad(where, "$field.shape[$d]", "is $v, more than ${Int.MAX_VALUE}")
                    bytes = if (v == 0L || bytes <= MAX_TENSOR_BYTES / v) bytes * v else MAX_TENSOR_BYTES + 1
                    v.toInt()
                }
                if (bytes > MAX_TENSOR_BYTES) {
                    bad(where, "$field.shape", "${PockTensor.shapeString(dims)} of $dtypeName needs more than " +
                        "$MAX_TENSOR_BYTES bytes (what one buffer can hold)")
                }
                TensorSpec(name, dims, dtype)
            }
        }

        /** manifest["prefix"]: null, or an object whose "files" (when given) lie inside the bundle. */
        @Suppress("UNCHECKED_CAST")
        private fun Map<String, Any?>.prefix(dir: File, where: String): Map<String, Any?>? {
            val p = this["prefix"] ?: return null
            if (p !is Map<*, *>) bad(where, "prefix", "must be an object or null, got ${typeName(p)}")
            when (val files = p["files"]) {
                null -> {}
                is Map<*, *> -> for ((k, v) in files) {
                    inside(dir, v as? String ?: bad(where, "prefix.files.$k", "must be a string, got ${typeName(v)}"),
                           "prefix.files.$k", where)
                }
                else -> bad(where, "prefix.files", "must be an object, got ${typeName(files)}")
            }
            return p as Map<String, Any?>
        }
    }
}
