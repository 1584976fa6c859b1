package ai.pockengine.android

import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockStepStatus
import ai.pockengine.PockTensor
import ai.pockengine.PockTrainer
import android.content.Context
import androidx.work.Constraints
import androidx.work.Data
import androidx.work.ExistingPeriodicWorkPolicy
import androidx.work.PeriodicWorkRequest
import androidx.work.WorkManager
import androidx.work.Worker
import androidx.work.WorkerParameters
import java.io.File
import java.util.concurrent.TimeUnit

/**
 * Fine-tunes a bundled model in the background with WorkManager (which runs
 * doWork() on its own executor).  Needs androidx.work:work-runtime in the app.
 *
 *     class KeyboardTraining(c: Context, p: WorkerParameters) : PockTrainingWorker(c, p) {
 *         override val model = "keyboard"
 *         override fun batches() = recentSentences().map { (x, y) -> listOf(x) to listOf(y) }
 *     }
 *     PockTrainingWorker.schedule(context, KeyboardTraining::class.java, "keyboard-training")
 *
 * What a run does:
 *  - opens the bundle's trainer and loads [checkpoint] (a trained-only checkpoint: the
 *    user's few MB, tied to the shipped base weights) when there is one;
 *  - trains on [batches]; a non-finite batch is skipped and counted (never thrown), so
 *    one bad batch never costs the run's training;
 *  - saves [checkpoint] (trained-only, atomic) every [checkpointEvery] batches, when the OS
 *    stops the work, at the end, and before reporting a failure (a batch of the wrong shape);
 *  - remembers in [progressFile] how many of this run's batches are done, so a run the OS
 *    stopped resumes with the next batch (Result.retry: WorkManager runs it again), and
 *    forgets it once the run completes.
 */
abstract class PockTrainingWorker(context: Context, params: WorkerParameters) : Worker(context, params) {
    /** The model under assets/pockengine/. */
    abstract val model: String

    /**
     * This run's batches: (inputs, targets) per step; empty skips the run.  A resumed run
     * gets the same batches again (their order must be the same) and drops the done ones.
     */
    abstract fun batches(): Sequence<Pair<List<PockTensor>, List<PockTensor>>>

    /** Where the fine-tuned state lives between runs (a trained-only checkpoint). */
    open val checkpoint: File get() = File(applicationContext.noBackupFilesDir, "pockengine/$model.pockckpt")

    /** How many of the current run's batches are done (while a run is unfinished). */
    open val progressFile: File get() = File(checkpoint.path + ".progress")

    /** Save the checkpoint every this many batches (besides on stop and at the end). */
    open val checkpointEvery: Int get() = 20

    open val options: PockOptions get() = PockOptions()

    /** Opens the trainer (override to open it another way, e.g. from a directory). */
    open fun openTrainer(): PockTrainer = PockAssets.openTrainer(applicationContext, model, options)

    override fun doWork(): Result {
        var done = 0L
        var steps = 0
        var skipped = 0
        var loss = Float.NaN
        return try {
            openTrainer().use { trainer ->
                if (checkpoint.isFile) trainer.load(checkpoint)
                val resumeAt = readProgress()
                done = resumeAt
                var stopped = false
                try {
                    for ((inputs, targets) in batches().drop(resumeAt.coerceAtMost(Int.MAX_VALUE.toLong()).toInt())) {
                        if (isStopped) {
                            stopped = true
                            break
                        }
                        val l = trainer.step(inputs, targets)
                        done++
                        steps++
                        if (trainer.lastStepStatus == PockStepStatus.OK) loss = l else skipped++
                        if (done % checkpointEvery == 0L) saveProgress(trainer, done)
                    }
                } catch (e: PockException) {
                    // keep what was trained before the error; the run is over (no retry), so no progress
                    if (steps > 0) trainer.save(checkpoint, trainedOnly = true)
                    progressFile.delete()
                    throw e
                }
                if (stopped) { // the OS ended the work: keep the progress, WorkManager runs us again
                    saveProgress(trainer, done)
                    return Result.retry()
                }
                if (steps > 0) trainer.save(checkpoint, trainedOnly = true)
                progressFile.delete()
                Result.success(output(steps, skipped, loss, done))
            }
        } catch (e: PockException) {
            Result.failure(Data.Builder().putString(KEY_ERROR, e.message).putInt(KEY_STEPS, steps)
                .putInt(KEY_SKIPPED, skipped).build())
        }
    }

    private fun output(steps: Int, skipped: Int, loss: Float, done: Long): Data = Data.Builder()
        .putInt(KEY_STEPS, steps).putInt(KEY_SKIPPED, skipped).putFloat(KEY_LOSS, loss).putLong(KEY_BATCHES, done)
        .build()

    /** Checkpoint first, then the count: a crash between the two repeats batches, never skips one. */
    private fun saveProgress(trainer: PockTrainer, done: Long) {
        checkpoint.parentFile?.mkdirs()
        trainer.save(checkpoint, trainedOnly = true)
        val tmp = File(progressFile.path + ".tmp")
        tmp.writeText(done.toString())
        if (!tmp.renameTo(progressFile)) {
            progressFile.delete()
            tmp.renameTo(progressFile)
        }
    }

    private fun readProgress(): Long =
        if (progressFile.isFile) progressFile.readText().trim().toLongOrNull()?.coerceAtLeast(0) ?: 0 else 0

    companion object {
        const val KEY_STEPS = "pock_steps"
        const val KEY_SKIPPED = "pock_skipped"
        const val KEY_LOSS = "pock_loss"
        const val KEY_BATCHES = "pock_batches"
        const val KEY_ERROR = "pock_error"

        /** Run [worker] about every [hours] while the device is charging and idle. */
        @JvmStatic
        @JvmOverloads
        fun schedule(context: Context, worker: Class<out PockTrainingWorker>, uniqueName: String, hours: Long = 24) {
            val constraints = Constraints.Builder()
                .setRequiresCharging(true)
                .setRequiresDeviceIdle(true)
                .setRequiresBatteryNotLow(true)
                .build()
            val request = PeriodicWorkRequest.Builder(worker, hours, TimeUnit.HOURS).setConstraints(constraints).build()
            WorkManager.getInstance(context).enqueueUniquePeriodicWork(uniqueName, ExistingPeriodicWorkPolicy.KEEP, request)
        }
    }
}
