package org.pockengine.keyboard.app

import ai.pockengine.PockTrainer
import android.app.Application
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.FileBlobStore
import org.pockengine.keyboard.Personalizer
import org.pockengine.keyboard.StepTrainer
import org.pockengine.keyboard.SuggestionRanker
import org.pockengine.keyboard.Tokenizer
import org.pockengine.keyboard.TrainingBuffer
import org.pockengine.keyboard.TrainingPolicy
import java.io.File

/**
 * The app's one trainer and the shared logic around it. The keyboard predicts with the
 * trainer's current weights; the background worker trains the same trainer and saves
 * user.pockckpt, which the next start restores. Everything lives in filesDir (not backed up).
 */
class KeyboardApp : Application() {
    val tokenizer by lazy { Tokenizer.fromVocabText(assets.open("vocab.txt").reader().readText()) }
    val buffer by lazy { TrainingBuffer(FileBlobStore(File(filesDir, "typed_sentences.txt"))) }
    val policy = TrainingPolicy(batch = BATCH, seq = SEQ)
    val personalizer by lazy { Personalizer(tokenizer, buffer, policy, FileBlobStore(File(filesDir, "learning_stats.txt"))) }
    val checkpoint: File get() = File(filesDir, "user.pockckpt")
    private var opened: PockTrainer? = null

    /** The trainer: the shipped base weights, or the user's checkpoint once there is one. */
    @Synchronized
    fun trainer(): PockTrainer = opened ?: run {
        val dir = File(noBackupFilesDir, "model/$MODEL")
        if (!dir.exists()) copyAssets("pockengine/$MODEL", dir)
        PockTrainer.open(dir).also { t ->
            if (checkpoint.exists()) t.load(checkpoint)
            opened = t
        }
    }

    /** predict/step of [trainer] at the compiled shape (PockKeyboardModel.kt, shared with the JVM test). */
    private val model by lazy { PockKeyboardModel(CompiledShape(BATCH, SEQ, tokenizer.size)) { trainer() } }
    val ranker by lazy { SuggestionRanker(tokenizer, model, maxContext = SEQ) }
    val stepTrainer: StepTrainer get() = model

    /** "Forget what I typed": buffer, stats and the personalized weights. */
    @Synchronized
    fun forget() {
        personalizer.forget()
        checkpoint.delete()
        opened?.close()
        opened = null
    }

    private fun copyAssets(path: String, to: File) {
        to.mkdirs()
        for (name in assets.list(path).orEmpty()) {
            assets.open("$path/$name").use { input -> File(to, name).outputStream().use { input.copyTo(it) } }
        }
    }

    companion object {
        const val MODEL = "keyboard_base"   // spec.py:make_base's name
        const val BATCH = 8
        const val SEQ = 16
    }
}
