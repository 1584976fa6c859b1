// The keyboard app's shared logic (demo-apps/keyboard/shared) over the real compiled trainer:
// PockKeyboardModel (the Android app's adapter, PockKeyboardModel.kt) puts SuggestionRanker
// and Personalizer on PockTrainer (sdk-android) and a host build of the base model's library
// with pock_jni.cpp. Driven by tests/demo/test_keyboard_app_jvm.py:
//
//   java -cp sdk.jar:this.jar:kotlin-stdlib.jar org.pockengine.keyboard.tests.KeyboardAppJvmTestKt \
//        BUNDLE_DIR LIBRARY VOCAB TYPED HELD WORK_DIR
//
// TYPED and HELD: the user's sentences, one a line (typed in rounds; held out for the metric).
// Prints one "key value..." line per fact for pytest; exits non-zero on an unexpected exception.
package org.pockengine.keyboard.tests

import ai.pockengine.PockOptions
import ai.pockengine.PockTrainer
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.FileBlobStore
import org.pockengine.keyboard.NextWordModel
import org.pockengine.keyboard.Personalizer
import org.pockengine.keyboard.StepTrainer
import org.pockengine.keyboard.SuggestionRanker
import org.pockengine.keyboard.Tokenizer
import org.pockengine.keyboard.TrainingBuffer
import org.pockengine.keyboard.TrainingPolicy
import org.pockengine.keyboard.app.PockKeyboardModel
import java.io.File
import kotlin.random.Random

const val BATCH = 8   // KeyboardApp.BATCH / SEQ: spec.py:make_base's compiled shape
const val SEQ = 16
const val HELD_SENTENCES = 16   // held-out sentences scored before and after training
val PREFIXES = listOf("under the terms of the ", "this license ", "you may ")  // the cursor after a space: next-word suggestions

fun report(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

/** The logits the ranker saw last (one predict per suggestion, as on the phone). */
class Recording(private val inner: NextWordModel) : NextWordModel {
    var last = FloatArray(0)
    override fun nextLogits(context: IntArray): FloatArray = inner.nextLogits(context).also { last = it }
}

/** Held-out next-word metric through SuggestionRanker.suggest on the text before the cursor:
 *  top-1/top-3 hits and the correct word's rank among the suggestable words. */
class Scores(val top1: Int, val top3: Int, val count: Int, val meanRank: Double, val suggestions: List<List<String>>)

fun score(tok: Tokenizer, model: NextWordModel, held: List<String>): Scores {
    val rec = Recording(model)
    val ranker = SuggestionRanker(tok, rec, maxContext = SEQ)
    val suggestable = tok.suggestable
    var top1 = 0
    var top3 = 0
    var count = 0
    var rankSum = 0.0
    val all = mutableListOf<List<String>>()
    for (sentence in held) {
        val words = Tokenizer.tokens(sentence).map { if (it == "<num>") "7" else it }
        for (i in words.indices) {
            val target = tok.id(words[i])
            if (target !in suggestable) continue
            val prefix = words.take(i).joinToString(" ") + if (i > 0) " " else ""
            val top = ranker.suggest(prefix, 3)
            all += top
            count++
            if (top.firstOrNull() == words[i]) top1++
            if (words[i] in top) top3++
            val l = rec.last[target]
            rankSum += 1 + suggestable.count { rec.last[it] > l || (rec.last[it] == l && it < target) }
        }
    }
    return Scores(top1, top3, count, rankSum / count, all)
}

fun main(args: Array<String>) {
    val (bundleDir, library, vocab, typedFile, heldFile) = args.take(5).map(::File)
    val work = File(args[5])
    val typed = typedFile.readLines().filter { it.isNotBlank() }
    val held = heldFile.readLines().filter { it.isNotBlank() }.take(HELD_SENTENCES)
    val options = PockOptions(libraryFile = library, numThreads = 2)
    val tok = Tokenizer.fromVocabText(vocab.readText())

    // KeyboardApp's wiring, with plain files for filesDir.
    val bufferFile = File(work, "typed_sentences.txt")
    val statsFile = File(work, "learning_stats.txt")
    val checkpoint = File(work, "user.pockckpt")
    val buffer = TrainingBuffer(FileBlobStore(bufferFile))
    val policy = TrainingPolicy(batch = BATCH, seq = SEQ)
    val personalizer = Personalizer(tok, buffer, policy, FileBlobStore(statsFile))
    var trainer = PockTrainer.open(bundleDir, options)
    val shape = CompiledShape(BATCH, SEQ, tok.size)
    val model = PockKeyboardModel(shape) { trainer }
    val ranker = SuggestionRanker(tok, model, maxContext = SEQ)
    val losses = mutableListOf<Float>()
    val stepTrainer = StepTrainer { x, y -> model.step(x, y).also { losses += it } }
    report("model", "${trainer.modelName} ${trainer.inputs.joinToString()} -> ${trainer.outputs.joinToString()}")
    report("vocab", tok.size)

    val t0 = System.nanoTime()
    val base = score(tok, model, held)
    val evalSeconds = (System.nanoTime() - t0) / 1e9
    report("base", "${base.top1} ${base.top3} ${base.count} ${base.meanRank}")
    report("eval_seconds", evalSeconds)
    val basePrefixes = PREFIXES.map { ranker.suggest(it) }
    for ((p, s) in PREFIXES.zip(basePrefixes)) report("base_suggest.${p.trim().replace(' ', '_')}", s.joinToString(","))

    // The user types; the background worker asks the policy (WorkManager: only while charging).
    val random = Random(1)
    val sessions = mutableListOf<Int>()
    var expectedSteps = 0
    fun session(charging: Boolean): Int {
        val newTokens = buffer.untrainedSentences().sumOf { tok.encodeMessage(it).size }
        val buffered = buffer.sentences().sumOf { tok.encodeMessage(it).size }
        if (charging) expectedSteps += policy.steps(newTokens, buffered)
        val t = System.nanoTime()
        val steps = personalizer.trainIfReady(stepTrainer, charging, nowMillis = 1_000L * (sessions.size + 1), random = random)
        if (steps > 0) trainer.save(checkpoint)   // TrainWorker: save the personalized weights after training
        sessions += steps
        report("session.${sessions.size}", "$steps steps charging=$charging new=$newTokens buffered=$buffered " +
            "seconds=${(System.nanoTime() - t) / 1e9}")
        return steps
    }
    typed.take(3).forEach(buffer::add)
    session(charging = true)            // too few new tokens: not yet
    val rounds = typed.drop(3).chunked((typed.size - 3 + 2) / 3)
    for ((r, sentences) in rounds.withIndex()) {
        sentences.forEach(buffer::add)
        if (r == 0) session(charging = false)   // not charging: waits, keeps the sentences untrained
        session(charging = true)
    }
    val totalSteps = sessions.sum()
    report("steps_expected", expectedSteps)
    report("steps_total", totalSteps)
    report("step_count", trainer.stepCount)
    report("stats", personalizer.stats.encode().trim().replace('\n', ' '))
    report("buffer", "${buffer.size} untrained=${buffer.untrained}")
    report("losses", losses.joinToString(" "))

    val trained = score(tok, model, held)
    report("trained", "${trained.top1} ${trained.top3} ${trained.count} ${trained.meanRank}")
    val trainedPrefixes = PREFIXES.map { ranker.suggest(it) }
    for ((p, s) in PREFIXES.zip(trainedPrefixes)) report("trained_suggest.${p.trim().replace(' ', '_')}", s.joinToString(","))
    report("changed_suggestions", "${base.suggestions.zip(trained.suggestions).count { (a, b) -> a != b }} ${base.count}")

    // The checkpoint the worker saved restores into a new trainer (the app's next start).
    val fresh = PockTrainer.open(bundleDir, options)
    val freshModel = PockKeyboardModel(shape) { fresh }
    report("fresh_equals_base", PREFIXES.map { SuggestionRanker(tok, freshModel, SEQ).suggest(it) } == basePrefixes)
    fresh.load(checkpoint)
    report("restored_step_count", fresh.stepCount)
    val restored = score(tok, freshModel, held)
    report("restored_suggestions_equal", restored.suggestions == trained.suggestions)
    val context = tok.encodeMessage(held[0])
    report("restored_logits_equal", freshModel.nextLogits(context).contentEquals(model.nextLogits(context)))
    fresh.close()

    // "Forget what I typed" with the trainer open: buffer and stats go, the trainer keeps working.
    personalizer.forget()
    report("forget_buffer", "${buffer.size} untrained=${buffer.untrained} file=${bufferFile.exists()} " +
        "reloaded=${TrainingBuffer(FileBlobStore(bufferFile)).size}")
    report("forget_stats", "steps=${personalizer.stats.steps} file=${statsFile.exists()}")
    report("forget_trainer_open", "${!trainer.isClosed} ${PREFIXES.map { ranker.suggest(it) } == trainedPrefixes}")
    report("forget_train_again", personalizer.trainIfReady(stepTrainer, charging = true, nowMillis = 99_000L, random = random))
    // ... then KeyboardApp.forget: the checkpoint goes and the trainer reopens on the base weights.
    checkpoint.delete()
    trainer.close()
    trainer = PockTrainer.open(bundleDir, options)
    report("forget_reopened", "${trainer.stepCount} ${PREFIXES.map { ranker.suggest(it) } == basePrefixes} ${checkpoint.exists()}")
    trainer.close()
    report("done", true)
}
