package org.pockengine.keyboard

import kotlin.math.ceil
import kotlin.random.Random

/** One training step of the compiled program: the SDK's `PockTrainer.step` in the apps. */
fun interface StepTrainer {
    /** x and y: batch x seq ids (y is x shifted by one word); returns the loss. */
    fun step(x: IntArray, y: IntArray): Float
}

/**
 * When and how much to train (sim/simulate.py's Policy has the same rule and defaults):
 * only while charging, once at least [minNewTokens] new tokens are buffered; then
 * [passes] passes over the whole buffer in batch x seq windows, at most [maxSteps] steps.
 */
class TrainingPolicy(
    val batch: Int = 8,
    val seq: Int = 16,
    val minNewTokens: Int = 200,
    val passes: Double = 2.0,
    val maxSteps: Int = 150,
) {
    fun steps(newTokens: Int, bufferedTokens: Int): Int =
        if (newTokens < minNewTokens) 0
        else minOf(maxSteps, ceil(passes * bufferedTokens / (batch * seq)).toInt())

    fun shouldTrain(newTokens: Int, charging: Boolean): Boolean = charging && newTokens >= minNewTokens

    /** One batch of random windows of [stream]: (x, y), each batch x seq ids. */
    fun batch(stream: IntArray, random: Random): Pair<IntArray, IntArray> {
        require(stream.size >= 2) { "nothing to train on" }
        val x = IntArray(batch * seq) { Tokenizer.PAD }
        val y = IntArray(batch * seq) { Tokenizer.PAD }
        for (b in 0 until batch) {
            val start = random.nextInt(maxOf(1, stream.size - seq - 1))
            for (t in 0 until seq) {
                if (start + t + 1 >= stream.size) break
                x[b * seq + t] = stream[start + t]
                y[b * seq + t] = stream[start + t + 1]
            }
        }
        return x to y
    }
}

/** What the settings screen shows: how much the keyboard has learned. */
data class LearningStats(
    val steps: Long = 0,
    val lastLoss: Float = Float.NaN,
    val lastTrainedMillis: Long = 0,
    val sentencesLearned: Long = 0,
) {
    fun encode(): String = "steps=$steps\nlastLoss=$lastLoss\nlastTrainedMillis=$lastTrainedMillis\n" +
        "sentencesLearned=$sentencesLearned\n"

    companion object {
        fun decode(text: String?): LearningStats {
            val kv = text?.lines()?.mapNotNull { l -> l.split("=", limit = 2).takeIf { it.size == 2 } }
                ?.associate { it[0] to it[1] } ?: return LearningStats()
            return LearningStats(
                kv["steps"]?.toLongOrNull() ?: 0, kv["lastLoss"]?.toFloatOrNull() ?: Float.NaN,
                kv["lastTrainedMillis"]?.toLongOrNull() ?: 0, kv["sentencesLearned"]?.toLongOrNull() ?: 0,
            )
        }
    }
}

/**
 * One background training session (WorkManager on Android, BGProcessingTask on iOS):
 * asks the policy, runs the bounded steps on the buffer through [StepTrainer], marks the
 * buffer trained and records the stats. The caller saves the trainer's checkpoint after.
 */
class Personalizer(
    private val tokenizer: Tokenizer,
    private val buffer: TrainingBuffer,
    private val policy: TrainingPolicy,
    private val statsStore: BlobStore,
) {
    val stats: LearningStats get() = LearningStats.decode(statsStore.read())

    /** Returns the steps run (0 when the policy says not yet). */
    fun trainIfReady(trainer: StepTrainer, charging: Boolean, nowMillis: Long, random: Random = Random.Default): Int {
        val newTokens = buffer.untrainedSentences().sumOf { tokenizer.encodeMessage(it).size }
        if (!policy.shouldTrain(newTokens, charging)) return 0
        val stream = buffer.sentences().flatMap { tokenizer.encodeMessage(it).asIterable() }.toIntArray()
        val steps = policy.steps(newTokens, stream.size)
        var loss = Float.NaN
        repeat(steps) {
            val (x, y) = policy.batch(stream, random)
            loss = trainer.step(x, y)
        }
        val learned = buffer.untrained
        buffer.markTrained()
        val old = stats
        statsStore.write(LearningStats(old.steps + steps, loss, nowMillis, old.sentencesLearned + learned).encode())
        return steps
    }

    /** The same with a seeded Random (for Swift, which does not see Kotlin's default arguments). */
    fun trainIfReady(trainer: StepTrainer, charging: Boolean, nowMillis: Long, seed: Long): Int =
        trainIfReady(trainer, charging, nowMillis, Random(seed))

    /** "Forget what I typed": the buffer and the stats (the app also restores the base weights). */
    fun forget() {
        buffer.clear()
        statsStore.delete()
    }
}
