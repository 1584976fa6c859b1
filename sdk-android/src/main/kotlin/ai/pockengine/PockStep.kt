package ai.pockengine

/** What the last [PockTrainer.step] did: Python's `trainer.last_step_status`. */
enum class PockStepStatus {
    /** The update was applied. */
    OK,
    /**
     * A NaN/inf input, loss or gradient, or no real target (every label the ignore index): no
     * update applied, counted in [PockTrainer.skippedSteps].
     */
    SKIPPED,
    /**
     * A gradient found non-finite after some of the step's updates had already run (models
     * compiled with exact_skip=False; see pock.h); the later updates were skipped.  Counted too.
     */
    PARTIAL,
}

/** A state tensor of the compiled model: parameter, buffer, optimizer state or constant. */
data class StateTensorSpec(val name: String, val dtype: PockDType, val shape: IntArray, val kind: Kind) {
    enum class Kind { PARAM, BUFFER, OPTIMIZER_STATE, CONSTANT }

    override fun equals(other: Any?): Boolean =
        other is StateTensorSpec && name == other.name && dtype == other.dtype && kind == other.kind &&
            shape.contentEquals(other.shape)

    override fun hashCode(): Int = name.hashCode()
    override fun toString(): String = "$name: ${dtype.manifestName}${PockTensor.shapeString(shape)} ($kind)"
}

/** One step of [PockTrainer.train], handed to its progress callback. */
data class PockProgress(
    /** 1-based index of the step in this train() call. */
    val step: Int,
    val loss: Float,
    val status: PockStepStatus,
    /** The trainer's [PockTrainer.skippedSteps] after this step. */
    val skippedSteps: Long,
)

/** What [PockTrainer.train] did: one loss per step (NaN/inf for skipped ones). */
data class PockTrainResult(val losses: List<Float>, val skipped: Int) {
    val steps: Int get() = losses.size
    /** The last applied step's loss, NaN if none was applied. */
    val lastLoss: Float get() = losses.lastOrNull { it.isFinite() } ?: Float.NaN
}

/** One node of the training step, timed by [PockTrainer.profile] (Python's `trainer.profile` rows). */
data class PockNodeTime(
    val index: Int,
    /** "forward", "backward" or "update". */
    val phase: String,
    val op: String,
    val kernel: String,
    val module: String,
    val flops: Long,
    /** Mean milliseconds per step in this node. */
    val ms: Double,
)

/** Per-node times of [PockTrainer.profile]; [stepMs] is the measured wall time per step. */
data class PockProfile(val nodes: List<PockNodeTime>, val steps: Int, val stepMs: Double, val losses: List<Float>) {
    /** Time per kernel summed over the nodes that call it, slowest first (ms per step). */
    fun byKernel(): List<Pair<String, Double>> =
        nodes.groupBy { it.kernel }.map { (k, v) -> k to v.sumOf { it.ms } }.sortedByDescending { it.second }

    /** A plain-text table: the slowest [top] nodes. */
    fun table(top: Int = 20): String = buildString {
        append("step %.3f ms over %d steps\n".format(stepMs, steps))
        for (n in nodes.sortedByDescending { it.ms }.take(top)) {
            append("%4d %-8s %-14s %-24s %8.3f ms  %s\n".format(n.index, n.phase, n.op, n.kernel, n.ms, n.module))
        }
    }
}
