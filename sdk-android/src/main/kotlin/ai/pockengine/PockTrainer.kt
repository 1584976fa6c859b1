package ai.pockengine

import java.io.File
import java.io.InputStream
import java.util.concurrent.CompletableFuture
import java.util.concurrent.Executor
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.ensureActive

/**
 * Fine-tunes one compiled model on the device: the whole training step
 * (forward, loss, backward, optimizer) runs in the model's generated C++
 * behind pock.h.  The same vocabulary as Python's `Trainer` and Swift's
 * `PockTrainer` (step, forward, save/load, getTensor/setTensor,
 * lastStepStatus/skippedSteps, setLearningRate/setNumThreads, close):
 *
 *     PockTrainer.open(modelDir).use { trainer ->
 *         val loss = trainer.step(PockTensor.of(tokens, 4, 16), PockTensor.of(next, 4, 16))
 *         val logits = trainer.forward(PockTensor.of(tokens, 4, 16)).toFloatArray()
 *         trainer.save(File(filesDir, "user.pockckpt"), trainedOnly = true)
 *     }
 *
 * Bad batches: a batch whose input, loss or gradients are NaN/inf applies no
 * update and does not throw; it sets [lastStepStatus] to SKIPPED and counts
 * in [skippedSteps] (with [PockOptions.strict] it throws instead).  A batch
 * with no real target (every label the ignore index) is skipped and counted
 * the same way, strict or not, with loss 0.
 *
 * Thread safety: every method may be called from any thread.  Each trainer
 * holds one lock; calls on it run one at a time in the order they take the
 * lock (pock.h's rule: one trainer, serialised calls), and close() waits for
 * a call in flight.  Different trainers never block each other.  Keep
 * training off the main thread with [train] inside `withContext(Dispatchers.Default)`
 * (cancellable between steps) or [stepAsync] with an Executor.
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
    /** Non-finite batches throw instead of being skipped (see [PockOptions.strict]). */
    val strict: Boolean,
) : AutoCloseable {
    private val lock = Any()

    val modelName: String get() = bundle.name
    val inputs: List<TensorSpec> get() = bundle.inputs
    val targets: List<TensorSpec> get() = bundle.targets
    val outputs: List<TensorSpec> get() = bundle.outputs

    /** True once close() ran. */
    val isClosed: Boolean get() = synchronized(lock) { handle == 0L }

    /** What the last step did (OK before any step). */
    @Volatile var lastStepStatus: PockStepStatus = PockStepStatus.OK
        private set

    /** The last skipped step's message (which tensor was NaN/inf); empty after an applied step. */
    @Volatile var lastStepMessage: String = ""
        private set

    /** Steps of this trainer that applied no update: a non-finite batch, or one with no real target. */
    @Volatile var skippedSteps: Long = 0
        private set

    // -------------------------------------------------------------------------------- training
    /**
     * One training step on a batch; returns the loss.  A non-finite batch returns the loss it
     * computed (NaN/inf), applies no update and is counted (see the class comment).
     */
    fun step(inputs: List<PockTensor>, targets: List<PockTensor>): Float {
        val ins = runPrefix(inputs)
        check("step", "input", ins, bundle.inputs)
        check("step", "target", targets, bundle.targets)
        val args = NativeArgs(ins + targets)
        val skipped = arrayOfNulls<String>(2)  // [why, "NONFINITE" | "NO_TARGETS"] of a skipped step
        return withHandle("step") {
            val loss = PockNative.step(it, args.data, args.offsets, args.dtypes, args.ndims, args.dims, ins.size, skipped)
            val why = skipped[0]
            if (why == null) {
                lastStepStatus = PockStepStatus.OK
                lastStepMessage = ""
            } else {
                // no real target (every label ignore_index): nothing to learn from, skipped even when strict
                val noTargets = skipped[1] == PockStatus.NO_TARGETS.name
                skippedSteps++
                lastStepMessage = why
                lastStepStatus = if (!noTargets && "earlier update(s)" in why) PockStepStatus.PARTIAL else PockStepStatus.SKIPPED
                if (strict && !noTargets) throw PockException(PockStatus.NONFINITE, why)
            }
            loss
        }
    }

    /** One training step for a model with one input and one target. */
    fun step(input: PockTensor, target: PockTensor): Float = step(listOf(input), listOf(target))

    /**
     * Train on [batches] (inputs, targets per step) in the calling coroutine, checking for
     * cancellation before every step: cancel the job and this throws CancellationException
     * after the step in flight, with every finished step applied.  [onProgress] runs after
     * each step.  Run it off the main thread: `withContext(Dispatchers.Default) { trainer.train(b) }`.
     */
    suspend fun train(
        batches: Iterable<Pair<List<PockTensor>, List<PockTensor>>>,
        onProgress: ((PockProgress) -> Unit)? = null,
    ): PockTrainResult {
        val losses = ArrayList<Float>()
        var skipped = 0
        for ((x, y) in batches) {
            currentCoroutineContext().ensureActive()
            val loss = step(x, y)
            val status = lastStepStatus
            if (status != PockStepStatus.OK) skipped++
            losses.add(loss)
            onProgress?.invoke(PockProgress(losses.size, loss, status, skippedSteps))
        }
        return PockTrainResult(losses, skipped)
    }

    /** [train] over a lazily produced sequence of batches. */
    suspend fun train(
        batches: Sequence<Pair<List<PockTensor>, List<PockTensor>>>,
        onProgress: ((PockProgress) -> Unit)? = null,
    ): PockTrainResult = train(batches.asIterable(), onProgress)

    /** Inference (eval mode) with the current weights: new tensors, one per compiled output (any dtype). */
    fun forward(inputs: List<PockTensor>): List<PockTensor> {
        val outs = bundle.outputs.map { PockTensor.zeros(it.dtype, *it.shape) }
        forward(inputs, outs)
        return outs
    }

    /** Inference for a model with one input; returns its first output. */
    fun forward(input: PockTensor): PockTensor = forward(listOf(input))[0]

    /** Inference into caller-owned outputs (arrays or direct buffers of the compiled shapes and dtypes): no allocation. */
    fun forward(inputs: List<PockTensor>, outputs: List<PockTensor>) {
        val ins = runPrefix(inputs)
        check("forward", "input", ins, bundle.inputs)
        check("forward", "output", outputs, bundle.outputs)
        val args = NativeArgs(ins)
        val outData = Array<Any>(outputs.size) { outputs[it].data }
        val outOffsets = LongArray(outputs.size) { outputs[it].byteOffset }
        val outBytes = LongArray(outputs.size) { outputs[it].nbytes }
        withHandle("forward") {
            PockNative.forward(it, args.data, args.offsets, args.dtypes, args.ndims, args.dims, outData, outOffsets, outBytes)
        }
    }

    /**
     * Time every node of the training step over [steps] steps on one batch (after [warmup]
     * unprofiled ones), as Python's `trainer.profile`.  These are real training steps.
     */
    @JvmOverloads
    fun profile(inputs: List<PockTensor>, targets: List<PockTensor>, steps: Int = 20, warmup: Int = 3): PockProfile {
        if (steps < 1 || warmup < 0) {
            throw PockException(PockStatus.INVALID_ARGUMENT, "profile: steps must be >= 1 and warmup >= 0, got $steps, $warmup")
        }
        val h = withHandle("profile") { it }
        if (PockNative.profileCount(h) <= 0) {
            throw PockException(PockStatus.INVALID_ARGUMENT,
                "profile: model '${bundle.name}' was generated without profiling hooks; rebuild it with pock-build")
        }
        repeat(warmup) { step(inputs, targets) }
        synchronized(lock) {
            val live = withHandle("profile") { it }
            PockNative.profileEnable(live, true)
            try {
                PockNative.profileReset(live)
                val start = System.nanoTime()
                val losses = List(steps) { step(inputs, targets) }
                val elapsed = System.nanoTime() - start
                val counts = LongArray(4)
                val nodes = List(PockNative.profileCount(live)) { i ->
                    val (phase, op, kernel, module) = PockNative.profileEntry(live, i, counts)
                    PockNodeTime(counts[0].toInt(), phase, op, kernel, module, counts[1],
                        if (counts[2] > 0) counts[3] / 1e6 / counts[2] else 0.0)
                }
                return PockProfile(nodes, steps, elapsed / 1e6 / steps, losses)
            } finally {
                PockNative.profileEnable(live, false)
            }
        }
    }

    // -------------------------------------------------------------------------------- state
    /**
     * Write a checkpoint to [file] atomically (temp file, fsync, rename): every state tensor,
     * the step count and the learning rate; with [trainedOnly], only the trained tensors,
     * buffers and optimizer state, tied to the frozen base weights by hash (Python's
     * `save(path, trained_only=True)`: the same file format).
     */
    @JvmOverloads
    fun save(file: File, trainedOnly: Boolean = false) = withHandle("save") {
        if (trainedOnly) PockNative.saveTrained(it, file.path) else PockNative.save(it, file.path)
    }

    /** Load a checkpoint (full or trained-only); it is validated whole before any state changes. */
    fun load(file: File) = withHandle("load") { PockNative.load(it, file.path) }

    /** The compiled model's state tensors, in model order. */
    val stateTensors: List<StateTensorSpec> by lazy {
        List(PockNative.tensorCount()) { i ->
            val info = PockNative.tensorInfo(i)
            StateTensorSpec(PockNative.tensorName(i), PockDType.of(info[0].toInt()),
                IntArray(info[1].toInt()) { d -> info[4 + d].toInt() }, StateTensorSpec.Kind.values()[info[2].toInt()])
        }
    }

    private fun stateSpec(name: String): StateTensorSpec =
        stateTensors.firstOrNull { it.name == name }
            ?: throw PockException(PockStatus.INVALID_ARGUMENT, "model '${bundle.name}' has no state tensor '$name'")

    /** A copy of the state tensor [name] (parameter, buffer, optimizer state "<param>:<slot>"). */
    fun getTensor(name: String): PockTensor {
        val spec = stateSpec(name)
        val out = PockTensor.zeros(spec.dtype, *spec.shape)
        withHandle("getTensor") { PockNative.getTensor(it, name, out.data, out.byteOffset, out.nbytes) }
        return out
    }

    /** Overwrite the state tensor [name] with [data] (its dtype and shape). */
    fun setTensor(name: String, data: PockTensor) {
        val spec = stateSpec(name)
        if (data.dtype != spec.dtype) {
            throw PockException(PockStatus.DTYPE, "setTensor: '$name' is ${spec.dtype.manifestName}, got ${data.dtype.manifestName}")
        }
        if (!data.shape.contentEquals(spec.shape)) {
            throw PockException(PockStatus.SHAPE, "setTensor: '$name' has shape ${PockTensor.shapeString(spec.shape)}, " +
                "got ${PockTensor.shapeString(data.shape)}")
        }
        withHandle("setTensor") { PockNative.setTensor(it, name, data.data, data.byteOffset, data.nbytes) }
    }

    /** The learning rate the next step uses. */
    val learningRate: Float get() = withHandle("learningRate") { PockNative.getLearningRate(it) }

    fun setLearningRate(lr: Float) = withHandle("setLearningRate") { PockNative.setLearningRate(it, lr) }

    /** Training steps taken since the initial weights (restored with a checkpoint). */
    val stepCount: Long get() = withHandle("stepCount") { PockNative.stepCount(it) }

    fun setNumThreads(n: Int) = withHandle("setNumThreads") { PockNative.setNumThreads(it, n) }

    /** Free the native memory; idempotent.  Waits for a call in flight on another thread. */
    override fun close() {
        synchronized(lock) {
            if (generating) throw reentered("close")
            if (handle != 0L) {
                PockNative.close(handle)
                handle = 0L
            }
        }
    }

    // -------------------------------------------------------------------------------- the LLM loop (issue 37)
    /** True when the compiled model is a Llama-family causal LM that [generate] runs (pock_generate_supported). */
    val canGenerate: Boolean get() = PockNative.generateSupported()

    /**
     * The new token ids the model generates after [promptIds] (Python's `trainer.generate`), from
     * the current weights in place (LoRA adapters, low-precision frozen weights) with a KV cache.
     * [temperature] 0 is greedy; [topK] 0 and [topP] 1 are off; the same [seed] gives the same
     * tokens; a [stop] id ends generation and is kept in the result.  [onToken] streams: it is
     * called on this thread with each new token, and returning true stops after that token (as
     * Python's callback); an exception it throws stops generation and propagates.  It must not
     * call this trainer (PockException INVALID_ARGUMENT).  Bad arguments (an empty prompt, an id
     * outside the vocabulary, prompt + maxNewTokens past the model's context, maxNewTokens or
     * topK < 0, temperature < 0 or NaN, topP outside (0, 1]) throw PockException(VALUE) naming
     * them; a model that cannot generate throws INVALID_ARGUMENT saying why.
     */
    @JvmOverloads
    fun generate(
        promptIds: IntArray,
        maxNewTokens: Int = 32,
        temperature: Float = 0f,
        topK: Int = 0,
        topP: Float = 1f,
        seed: Long = 0,
        stop: IntArray = IntArray(0),
        onToken: ((Int) -> Boolean)? = null,
    ): IntArray {
        val listener = onToken?.let { f -> PockNative.TokenListener { token -> f(token.toInt()) } }
        return withHandle("generate") {
            generating = true
            try {
                PockNative.generate(it, promptIds, maxNewTokens, temperature, topK, topP, seed, stop, listener)
            } finally {
                generating = false
            }
        }
    }

    /**
     * Write the trainer's LoRA adapters to [path] (Python's `trainer.export_adapter`): [format]
     * "peft" makes [path] a folder of adapter_model.safetensors + adapter_config.json that
     * `peft.PeftModel.from_pretrained` loads onto the Hugging Face base model; "gguf" a llama.cpp
     * LoRA adapter file (`--lora`).  Written atomically (temp file, fsync, rename).  A model
     * without adapters or another format throws PockException(INVALID_ARGUMENT), an unwritable
     * path PockException(IO), each naming it.
     */
    @JvmOverloads
    fun exportAdapter(path: File, format: String = "peft") =
        withHandle("exportAdapter") { PockNative.exportAdapter(it, path.path, format) }

    // -------------------------------------------------------------------------------- background
    /** One step on [executor]: `trainer.stepAsync(pool, x, y).thenAccept { loss -> ... }`. */
    fun stepAsync(executor: Executor, inputs: List<PockTensor>, targets: List<PockTensor>): CompletableFuture<Float> {
        val future = CompletableFuture<Float>()
        executor.execute {
            try {
                future.complete(step(inputs, targets))
            } catch (e: Throwable) {
                future.completeExceptionally(e)
            }
        }
        return future
    }

    override fun toString(): String = "PockTrainer(${bundle.name}${if (isClosed) ", closed" else ""})"

    // -------------------------------------------------------------------------------- internals
    private inline fun <T> withHandle(what: String, call: (Long) -> T): T = synchronized(lock) {
        if (handle == 0L) throw PockException(PockStatus.CLOSED, "PockTrainer.$what: the trainer of '${bundle.name}' is closed")
        if (generating) throw reentered(what)
        call(handle)
    }

    /** True while [generate] runs (under the lock): only its onToken callback can see it. */
    private var generating = false

    private fun reentered(what: String) = PockException(PockStatus.INVALID_ARGUMENT,
        "PockTrainer.$what: called from generate's onToken callback; the trainer is busy generating")

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
            val trainer = PockTrainer(bundle, handle, options.prefixRunner, options.strict)
            try {
                if (options.numThreads > 0) trainer.setNumThreads(options.numThreads)
                options.learningRate?.let { trainer.setLearningRate(it) }
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
