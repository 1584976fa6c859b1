package ai.pockengine

import java.io.File
import java.io.InputStream
import java.util.concurrent.CompletableFuture
import java.util.concurrent.Executor
import kotlin.coroutines.resume
import kotlin.coroutines.resumeWithException
import kotlin.coroutines.suspendCoroutine

/**
 * Fine-tunes one compiled model on the device: the whole training step
 * (forward, loss, backward, optimizer) runs in the model's generated C++
 * behind pock.h.
 *
 *     PockTrainer.open(modelDir).use { trainer ->
 *         val loss = trainer.step(PockTensor.of(tokens, 4, 16), PockTensor.of(next, 4, 16))
 *         val logits = trainer.predict(PockTensor.of(tokens, 4, 16)).toFloatArray()
 *         trainer.save(File(filesDir, "user.pockckpt"))
 *     }
 *
 * Thread safety: every method may be called from any thread.  Each trainer
 * holds one lock; calls on it run one at a time in the order they take the
 * lock (pock.h's rule: one trainer, serialised calls), and close() waits for
 * a call in flight.  Different trainers never block each other.  To keep
 * training off the main thread use [submit] with an Executor or [runOn] from
 * a coroutine.
 *
 * Memory: the trainer's arena and state are native memory, freed by close()
 * (or `use {}`); any call after close() throws a [PockException] with status
 * [PockStatus.CLOSED].  Input arrays are pinned (GetPrimitiveArrayCritical)
 * or direct buffers read in place while the step copies them into the arena.
 */
class PockTrainer private constructor(
    /** The model bundle this trainer was opened from. */
    val bundle: ModelBundle,
    private var handle: Long,
    private val prefixRunner: PrefixRunner?,
) : AutoCloseable {
    private val lock = Any()

    val modelName: String get() = bundle.name
    val inputs: List<TensorSpec> get() = bundle.inputs
    val targets: List<TensorSpec> get() = bundle.targets
    val outputs: List<TensorSpec> get() = bundle.outputs

    /** True once close() ran. */
    val isClosed: Boolean get() = synchronized(lock) { handle == 0L }

    // -------------------------------------------------------------------------------- training
    /** One training step on a batch; returns the loss. */
    fun step(inputs: List<PockTensor>, targets: List<PockTensor>): Float {
        val ins = runPrefix(inputs)
        check("step", "input", ins, bundle.inputs)
        check("step", "target", targets, bundle.targets)
        val args = NativeArgs(ins + targets)
        return withHandle("step") { PockNative.step(it, args.data, args.offsets, args.dtypes, args.ndims, args.dims, ins.size) }
    }

    /** One training step for a model with one input and one target. */
    fun step(input: PockTensor, target: PockTensor): Float = step(listOf(input), listOf(target))

    /** Inference (eval mode) with the current weights: new arrays, one per compiled output. */
    fun predict(inputs: List<PockTensor>): List<PockTensor> {
        val outs = bundle.outputs.map { PockTensor.zeros(it.dtype, *it.shape) }
        predictInto(inputs, outs)
        return outs
    }

    /** Inference for a model with one input; returns its first output. */
    fun predict(input: PockTensor): PockTensor = predict(listOf(input))[0]

    /** Inference into caller-owned outputs (arrays or direct buffers of the compiled shapes): no allocation. */
    fun predictInto(inputs: List<PockTensor>, outputs: List<PockTensor>) {
        val ins = runPrefix(inputs)
        check("predict", "input", ins, bundle.inputs)
        check("predict", "output", outputs, bundle.outputs)
        val args = NativeArgs(ins)
        val outData = Array<Any>(outputs.size) { outputs[it].data }
        val outOffsets = LongArray(outputs.size) { outputs[it].byteOffset }
        val outBytes = LongArray(outputs.size) { outputs[it].nbytes }
        withHandle("predict") {
            PockNative.forward(it, args.data, args.offsets, args.dtypes, args.ndims, args.dims, outData, outOffsets, outBytes)
        }
    }

    // -------------------------------------------------------------------------------- state
    /** Write weights, optimizer state, step count and learning rate to [file] (atomically: temp file, fsync, rename). */
    fun save(file: File) = withHandle("save") { PockNative.save(it, file.path) }

    /** Load a checkpoint; it is validated whole (magic, model hash, CRC) before any state changes. */
    fun restore(file: File) = withHandle("restore") { PockNative.load(it, file.path) }

    var learningRate: Float
        get() = withHandle("learningRate") { PockNative.getLearningRate(it) }
        set(value) = withHandle("learningRate") { PockNative.setLearningRate(it, value) }

    /** Training steps taken since the initial weights (restored with a checkpoint). */
    val stepCount: Long get() = withHandle("stepCount") { PockNative.stepCount(it) }

    fun setNumThreads(n: Int) = withHandle("setNumThreads") { PockNative.setNumThreads(it, n) }

    /** Free the native memory; idempotent.  Waits for a call in flight on another thread. */
    override fun close() {
        synchronized(lock) {
            if (handle != 0L) {
                PockNative.close(handle)
                handle = 0L
            }
        }
    }

    // -------------------------------------------------------------------------------- background
    /** Run [work] with this trainer on [executor]; the future completes with its result or exception. */
    fun <T> submit(executor: Executor, work: (PockTrainer) -> T): CompletableFuture<T> {
        val future = CompletableFuture<T>()
        executor.execute {
            try {
                future.complete(work(this))
            } catch (e: Throwable) {
                future.completeExceptionally(e)
            }
        }
        return future
    }

    /** One step on [executor]: `trainer.stepAsync(pool, x, y).thenAccept { loss -> ... }`. */
    fun stepAsync(executor: Executor, inputs: List<PockTensor>, targets: List<PockTensor>): CompletableFuture<Float> =
        submit(executor) { it.step(inputs, targets) }

    /**
     * Suspend while [work] runs with this trainer on [executor] (e.g. an
     * Executor-backed dispatcher's executor, or Executors.newSingleThreadExecutor()):
     *
     *     val loss = trainer.runOn(trainingExecutor) { t -> batches.map { (x, y) -> t.step(x, y) }.last() }
     *
     * Uses only kotlin.coroutines from the standard library.  Cancelling the
     * caller does not interrupt a native step already running.
     */
    suspend fun <T> runOn(executor: Executor, work: (PockTrainer) -> T): T = suspendCoroutine { cont ->
        executor.execute {
            val result = runCatching { work(this) }
            result.fold({ cont.resume(it) }, { cont.resumeWithException(it) })
        }
    }

    override fun toString(): String = "PockTrainer(${bundle.name}${if (isClosed) ", closed" else ""})"

    // -------------------------------------------------------------------------------- internals
    private inline fun <T> withHandle(what: String, call: (Long) -> T): T = synchronized(lock) {
        if (handle == 0L) throw PockException(PockStatus.CLOSED, "PockTrainer.$what: the trainer of '${bundle.name}' is closed")
        call(handle)
    }

    private fun runPrefix(inputs: List<PockTensor>): List<PockTensor> {
        val prefix = bundle.prefix ?: return inputs
        return prefixRunner!!.run(prefix, bundle.dir, inputs)
    }

    private fun check(what: String, role: String, given: List<PockTensor>, want: List<TensorSpec>) {
        if (given.size != want.size) {
            throw PockException(PockStatus.INVALID_ARGUMENT,
                "$what: model '${bundle.name}' takes ${want.size} ${role}(s) ${want.joinToString()}, got ${given.size}")
        }
        for (i in given.indices) {
            val t = given[i]
            val spec = want[i]
            val dtypeOk = t.dtype == spec.dtype || (t.dtype == PockDType.INT32 && spec.dtype == PockDType.INT64 && role != "output")
            if (!dtypeOk) {
                throw PockException(PockStatus.DTYPE,
                    "$what: $role $i ('${spec.name}') is ${t.dtype.manifestName}; the model was compiled for ${spec.dtype.manifestName}")
            }
            if (!spec.sameShape(t.dimsForNative)) {
                throw PockException(PockStatus.SHAPE,
                    "$what: $role $i ('${spec.name}') has shape ${PockTensor.shapeString(t.dimsForNative)}; " +
                        "the model was compiled for ${PockTensor.shapeString(spec.shape)}")
            }
        }
    }

    /** The parallel arrays pock_jni.cpp reads: data objects, byte offsets, dtypes, ndims, flattened dims. */
    private class NativeArgs(tensors: List<PockTensor>) {
        val data = Array<Any>(tensors.size) { tensors[it].data }
        val offsets = LongArray(tensors.size) { tensors[it].byteOffset }
        val dtypes = IntArray(tensors.size) { tensors[it].dtype.code }
        val ndims = IntArray(tensors.size) { tensors[it].dimsForNative.size }
        val dims = LongArray(ndims.sum()).also { out ->
            var k = 0
            for (t in tensors) for (d in t.dimsForNative) out[k++] = d.toLong()
        }
    }

    companion object {
        /** The native runtime's version (loads nothing; needs an opened model library). */
        @JvmStatic fun nativeVersion(): String = PockNative.version()

        /**
         * Open the model bundle in [modelDir] (model.json + weights).  Loads the
         * native library `pock_<name>` (or [PockOptions.libraryFile]) and checks
         * it is the bundle's model.
         */
        @JvmStatic
        @JvmOverloads
        fun open(modelDir: File, options: PockOptions = PockOptions()): PockTrainer {
            val bundle = ModelBundle.read(modelDir)
            if (bundle.prefix != null && options.prefixRunner == null) {
                throw PockException(PockStatus.BACKEND,
                    "model bundle '${bundle.name}' has a frozen prefix (${bundle.prefix["kind"] ?: bundle.prefix}) for " +
                        "an inference runtime, which this SDK does not run yet; pass PockOptions(prefixRunner = ...) " +
                        "or build the model without a prefix")
            }
            PockNative.ensureLoaded(bundle, options.libraryFile)
            val start = options.checkpoint ?: bundle.weights
            val handle = PockNative.open(start.path)
            val trainer = PockTrainer(bundle, handle, options.prefixRunner)
            try {
                if (options.numThreads > 0) trainer.setNumThreads(options.numThreads)
                options.learningRate?.let { trainer.learningRate = it }
            } catch (e: Throwable) {
                trainer.close()
                throw e
            }
            return trainer
        }

        /** Open a zipped bundle read from [bundle] (not closed), unpacked into [extractTo]. */
        @JvmStatic
        @JvmOverloads
        fun open(bundle: InputStream, extractTo: File, options: PockOptions = PockOptions()): PockTrainer =
            open(ModelBundle.unzip(bundle, extractTo).dir, options)
    }
}
