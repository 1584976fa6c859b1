package org.pockengine.keyboard.app

import ai.pockengine.PockTokenizer
import ai.pockengine.PockTrainer
import android.app.Application
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.FileBlobStore
import org.pockengine.keyboard.Personalizer
import org.pockengine.keyboard.SmartCompose
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

    /** Smart compose's LLM (optional: null when the app ships without the smart_compose bundle):
     *  its base bundle + tokenizer.json, and the user's adapters in smart_compose.pockckpt. */
    val composeCheckpoint: File get() = File(filesDir, "smart_compose.pockckpt")
    private var composer: PockTrainer? = null

    @Synchronized
    fun composeTrainer(): PockTrainer = composer ?: run {
        val dir = File(noBackupFilesDir, "model/$COMPOSE_MODEL")
        if (!dir.exists()) copyAssets("pockengine/$COMPOSE_MODEL", dir)
        PockTrainer.open(dir).also { t ->
            if (composeCheckpoint.exists()) t.load(composeCheckpoint)
            composer = t
        }
    }

    /** The shared SmartCompose over PockTokenizer + PockTrainer (PockLanguageModel.kt, run on the JVM by the tests). */
    val smartCompose: SmartCompose? by lazy {
        if (assets.list("pockengine/$COMPOSE_MODEL").isNullOrEmpty()) return@lazy null
        val trainer = composeTrainer()
        val tok = PockTokenizer.fromBytes(assets.open("pockengine/$COMPOSE_MODEL/tokenizer.json").use { it.readBytes() })
        val seq = trainer.inputs[0].shape[1]
        val lm = PockLanguageModel(tok, CompiledShape(1, seq, tok.vocabSize)) { composeTrainer() }
        SmartCompose(lm, lm, seq)
    }

    /** "Forget what I typed": buffer, stats and the personalized weights (both models). */
    @Synchronized
    fun forget() {
        personalizer.forget()
        checkpoint.delete()
        opened?.close()
        opened = null
        composeCheckpoint.delete()
        composer?.close()
        composer = null
    }

    private fun copyAssets(path: String, to: File) {
        to.mkdirs()
        for (name in assets.list(path).orEmpty()) {
            assets.open("$path/$name").use { input -> File(to, name).outputStream().use { input.copyTo(it) } }
        }
    }

    companion object {
        const val MODEL = "keyboard_base"   // spec.py:make_base's name
        const val COMPOSE_MODEL = "smart_compose"   // spec.py:make_smart_compose's name
        const val BATCH = 8
        const val SEQ = 16
    }
}
