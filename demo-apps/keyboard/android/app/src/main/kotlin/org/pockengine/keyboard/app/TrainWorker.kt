package org.pockengine.keyboard.app

import android.content.Context
import androidx.work.Constraints
import androidx.work.CoroutineWorker
import androidx.work.ExistingWorkPolicy
import androidx.work.OneTimeWorkRequestBuilder
import androidx.work.WorkManager
import androidx.work.WorkerParameters

/** Background fine-tuning: runs only while charging (and idle), a bounded number of steps
 *  chosen by TrainingPolicy, then saves the personalized weights; smart compose's LLM learns
 *  the same sentences (SmartCompose.learn) and saves its adapters. */
class TrainWorker(context: Context, params: WorkerParameters) : CoroutineWorker(context, params) {
    override suspend fun doWork(): Result {
        val app = applicationContext as KeyboardApp
        val fresh = app.buffer.untrainedSentences()
        val steps = app.personalizer.trainIfReady(app.stepTrainer, charging = true, nowMillis = System.currentTimeMillis())
        if (steps > 0) app.trainer().save(app.checkpoint)
        // smart compose learns the same new sentences (its LoRA adapters only), then keeps them
        val compose = app.smartCompose
        if (steps > 0 && compose != null) {
            fresh.forEach { compose.learn(it) }
            compose.flush()
            app.composeTrainer().save(app.composeCheckpoint, trainedOnly = true)
        }
        return Result.success()
    }

    companion object {
        fun schedule(context: Context) {
            val request = OneTimeWorkRequestBuilder<TrainWorker>()
                .setConstraints(Constraints.Builder().setRequiresCharging(true).setRequiresDeviceIdle(true).build())
                .build()
            WorkManager.getInstance(context).enqueueUniqueWork("personalize", ExistingWorkPolicy.KEEP, request)
        }
    }
}
