package ai.pockengine.android

import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockTensor
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
 * doWork() on its own executor): opens the trainer from the last checkpoint,
 * trains on [batches] and saves.  Needs androidx.work:work-runtime in the app.
 *
 *     class KeyboardTraining(c: Context, p: WorkerParameters) : PockTrainingWorker(c, p) {
 *         override val model = "keyboard"
 *         override fun batches() = recentSentences().map { (x, y) -> listOf(x) to listOf(y) }
 *     }
 *     PockTrainingWorker.schedule(context, KeyboardTraining::class.java, "keyboard-training")
 */
abstract class PockTrainingWorker(context: Context, params: WorkerParameters) : Worker(context, params) {
    /** The model under assets/pockengine/. */
    abstract val model: String

    /** This run's batches: (inputs, targets) per step; empty skips the run. */
    abstract fun batches(): Sequence<Pair<List<PockTensor>, List<PockTensor>>>

    /** Where the fine-tuned state lives between runs. */
    open val checkpoint: File get() = File(applicationContext.noBackupFilesDir, "pockengine/$model.pockckpt")

    open val options: PockOptions get() = PockOptions(checkpoint = checkpoint.takeIf { it.isFile })

    override fun doWork(): Result = try {
        PockAssets.openTrainer(applicationContext, model, options).use { trainer ->
            var steps = 0
            var loss = Float.NaN
            for ((inputs, targets) in batches()) {
                if (isStopped) break
                loss = trainer.step(inputs, targets)
                steps++
            }
            if (steps > 0) trainer.save(checkpoint) // atomic: a stopped run never corrupts the last checkpoint
            Result.success(Data.Builder().putInt(KEY_STEPS, steps).putFloat(KEY_LOSS, loss).build())
        }
    } catch (e: PockException) {
        Result.failure(Data.Builder().putString(KEY_ERROR, e.message).build())
    }

    companion object {
        const val KEY_STEPS = "pock_steps"
        const val KEY_LOSS = "pock_loss"
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
