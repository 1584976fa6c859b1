package ai.pockengine

import java.io.File

/**
 * How [PockTrainer.open] sets a trainer up; every field has a default.
 *
 *     PockTrainer.open(dir, PockOptions(numThreads = 2, checkpoint = File(filesDir, "user.pockckpt")))
 */
data class PockOptions @JvmOverloads constructor(
    /** Threads of the trainer's pool; 0 keeps the library's default (all cores). */
    val numThreads: Int = 0,
    /** Overrides the compiled learning rate (also the one stored in a checkpoint); null keeps it. */
    val learningRate: Float? = null,
    /** Start from this checkpoint (pock_save format) instead of the bundle's initial weights. */
    val checkpoint: File? = null,
    /** Load the model's native library from this file (System.load); null: System.loadLibrary("pock_<name>"). */
    val libraryFile: File? = null,
    /** Runs the bundle's frozen prefix, if it has one (see [PrefixRunner]). */
    val prefixRunner: PrefixRunner? = null,
    /**
     * A non-finite batch (NaN/inf in an input, the loss or a gradient) throws a [PockException]
     * ([PockStatus.NONFINITE]) instead of being skipped and counted in [PockTrainer.skippedSteps]
     * (Python's `strict=True`).  Either way no update is applied.
     */
    val strict: Boolean = false,
)

/**
 * Hook for a bundle whose manifest has a `prefix`: a frozen front of the model
 * exported for an inference runtime (e.g. an NPU), kept out of the compiled
 * C++ step.  The runner turns the caller's tensors into the compiled step's
 * inputs (model.json's `inputs`); the trainer calls it before every step and
 * forward.  This SDK ships no runner: without one, opening such a bundle
 * fails with a [PockException] that says so.
 */
fun interface PrefixRunner {
    fun run(prefix: Map<String, Any?>, bundleDir: File, inputs: List<PockTensor>): List<PockTensor>
}
