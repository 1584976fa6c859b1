package ai.pockengine

import java.io.File

/**
 * The JNI surface (src/main/cpp/pock_jni.cpp), one function per pock.h call.
 * Every function that can fail throws [PockException] carrying
 * pock_last_error().  Handles are `pock_trainer*` as Long; 0 is never valid.
 *
 * One model library per process: the JNI functions live in the model's own
 * library (`libpock_<name>.so`), so the first model loaded binds them.
 */
internal object PockNative {
    @JvmStatic external fun version(): String
    @JvmStatic external fun modelName(): String
    @JvmStatic external fun modelHash(): String

    @JvmStatic external fun open(checkpointPath: String?): Long
    @JvmStatic external fun close(handle: Long)

    /** One step over inputs then targets (nInputs of them are inputs); returns the loss. */
    @JvmStatic external fun step(
        handle: Long, data: Array<Any>, offsets: LongArray, dtypes: IntArray, ndims: IntArray, dims: LongArray,
        nInputs: Int,
    ): Float

    /** Inference into the output arrays / direct buffers (outBytes bytes each, from outOffsets). */
    @JvmStatic external fun forward(
        handle: Long, data: Array<Any>, offsets: LongArray, dtypes: IntArray, ndims: IntArray, dims: LongArray,
        outData: Array<Any>, outOffsets: LongArray, outBytes: LongArray,
    )

    @JvmStatic external fun save(handle: Long, path: String)
    @JvmStatic external fun load(handle: Long, path: String)
    @JvmStatic external fun getLearningRate(handle: Long): Float
    @JvmStatic external fun setLearningRate(handle: Long, lr: Float)
    @JvmStatic external fun stepCount(handle: Long): Long
    @JvmStatic external fun setNumThreads(handle: Long, n: Int)
    /** [dtype, ndim, dims...] of compiled input/target/output (group 0/1/2) [index], or null past the last. */
    @JvmStatic external fun ioInfo(group: Int, index: Int): LongArray?

    private var loaded: String? = null

    /** Load the bundle's native library once per process and check it is the bundle's model. */
    @Synchronized
    fun ensureLoaded(bundle: ModelBundle, libraryFile: File?) {
        val key = libraryFile?.absolutePath ?: bundle.library
        if (loaded == null) {
            try {
                if (libraryFile != null) System.load(libraryFile.absolutePath) else System.loadLibrary(bundle.library)
            } catch (e: UnsatisfiedLinkError) {
                throw PockException(
                    PockStatus.IO,
                    "cannot load the native library '$key' of model '${bundle.name}': ${e.message} " +
                        "(does the app ship jni/<abi>/lib${bundle.library}.so for this device's ABI?)",
                    e,
                )
            }
            loaded = key
        } else if (loaded != key && modelHash() != bundle.hash) {
            throw PockException(
                PockStatus.INVALID_ARGUMENT,
                "this process already loaded the model library '$loaded' (model '${modelName()}'); " +
                    "PockEngine runs one model library per process, so '${bundle.name}' cannot be opened",
            )
        }
        val hash = modelHash()
        if (hash != bundle.hash) {
            throw PockException(
                PockStatus.CHECKPOINT,
                "model bundle '${bundle.name}' (${bundle.dir}) was compiled as hash ${bundle.hash}, but the loaded " +
                    "library '$key' holds model '${modelName()}' hash $hash; rebuild them together with pock-build",
            )
        }
        bundle.checkAgainstLibrary { group, index -> ioInfo(group, index) }
    }
}
