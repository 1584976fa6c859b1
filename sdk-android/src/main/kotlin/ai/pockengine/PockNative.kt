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

    /**
     * One step over inputs then targets (nInputs of them are inputs); returns the loss.  A
     * skipped batch (POCK_ERR_NONFINITE, or POCK_ERR_NO_TARGETS: every label ignored; no update
     * applied) does not throw: its message goes into nonfinite[0] (null after a clean step) and,
     * when the array has a second slot, "NONFINITE" or "NO_TARGETS" into nonfinite[1]; every
     * other failure throws.
     */
    @JvmStatic external fun step(
        handle: Long, data: Array<Any>, offsets: LongArray, dtypes: IntArray, ndims: IntArray, dims: LongArray,
        nInputs: Int, nonfinite: Array<String?>,
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

    // state tensors by name (pock_get_tensor / pock_set_tensor): data is a primitive array or a
    // direct buffer holding nbytes from byte offset
    @JvmStatic external fun getTensor(handle: Long, name: String, data: Any, offset: Long, nbytes: Long)
    @JvmStatic external fun setTensor(handle: Long, name: String, data: Any, offset: Long, nbytes: Long)
    @JvmStatic external fun tensorCount(): Int
    @JvmStatic external fun tensorName(index: Int): String
    /** [dtype, ndim, kind, nbytes, shape...] of state tensor [index]. */
    @JvmStatic external fun tensorInfo(index: Int): LongArray

    /** pock_save_trained: the trained tensors, buffers and optimizer state only. */
    @JvmStatic external fun saveTrained(handle: Long, path: String)

    // per-node profiling (pock_profile_*)
    @JvmStatic external fun profileEnable(handle: Long, on: Boolean)
    @JvmStatic external fun profileReset(handle: Long)
    @JvmStatic external fun profileCount(handle: Long): Int
    /** Node [index]: returns [phase, op, kernel, module]; counts gets [index, flops, steps, total_ns]. */
    @JvmStatic external fun profileEntry(handle: Long, index: Int, counts: LongArray): Array<String>

    // generation and adapters out (issue 37): pock_generate_supported / pock_generate / pock_export_adapter
    /** Called with each new token of [generate]; true stops generation after it. */
    fun interface TokenListener {
        fun onToken(token: Long): Boolean
    }

    @JvmStatic external fun generateSupported(): Boolean
    /** The new ids after prompt (pock_generate with these options; listener nullable). */
    @JvmStatic external fun generate(
        handle: Long, prompt: IntArray, maxNewTokens: Int, temperature: Float, topK: Int, topP: Float, seed: Long,
        stop: IntArray, listener: TokenListener?,
    ): IntArray
    @JvmStatic external fun exportAdapter(handle: Long, path: String, format: String)

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
