// JVM checks of the keyboard's shared Kotlin logic (demo-apps/keyboard/shared), driven by
// tests/demo/test_keyboard_shared.py. `selftest` runs the in-process checks; the other
// commands let pytest compare with Python and restart the process between calls.
package org.pockengine.keyboard.tests

import org.pockengine.keyboard.BlobStore
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.FileBlobStore
import org.pockengine.keyboard.LearningStats
import org.pockengine.keyboard.NextWordModel
import org.pockengine.keyboard.Personalizer
import org.pockengine.keyboard.StepTrainer
import org.pockengine.keyboard.SuggestionRanker
import org.pockengine.keyboard.Tokenizer
import org.pockengine.keyboard.TrainingBuffer
import org.pockengine.keyboard.TrainingPolicy
import java.io.File
import java.nio.file.Files
import kotlin.random.Random
import kotlin.system.exitProcess

private var passed = 0
private val failures = mutableListOf<String>()

private fun check(name: String, ok: Boolean, detail: () -> String = { "" }) {
    if (ok) passed++ else failures += "$name ${detail()}"
}

private fun unescape(s: String): String = buildString {
    var i = 0
    while (i < s.length) {
        if (s[i] == '\\' && i + 1 < s.length) {
            append(when (s[i + 1]) { 't' -> '\t'; 'n' -> '\n'; else -> '\\' })
            i += 2
        } else append(s[i++])
    }
}

private fun ints(s: String): List<Int> = if (s.isBlank()) emptyList() else s.split(" ").map { it.toInt() }

/** A deterministic next-word model: word w scores 1 after word w-1 and scores[w] otherwise. */
private class BigramTable(val vocab: Int, val scores: FloatArray) : NextWordModel {
    var calls = 0
    var lastContext = IntArray(0)
    override fun nextLogits(context: IntArray): FloatArray {
        calls++
        lastContext = context
        return FloatArray(vocab) { w -> if (w == context.last() + 1) 100f else scores[w] }
    }
}

/** A trainer that learns the mean target id (a real, tiny model): loss = |mean(y) - m|. */
private class MeanTrainer : StepTrainer {
    var m = 0f
    var steps = 0
    val shapes = mutableSetOf<Int>()
    override fun step(x: IntArray, y: IntArray): Float {
        steps++
        shapes += x.size
        shapes += y.size
        val target = y.average().toFloat()
        val loss = kotlin.math.abs(target - m)
        m += 0.5f * (target - m)
        return loss
    }
}

private fun tokenizer() = Tokenizer(Tokenizer.SPECIALS + listOf(".", ",", "the", "cat", "sat", "on", "mat", "they", "then", "there"))

private fun tempDir(): File = Files.createTempDirectory("kb").toFile()

fun selftest() {
    val tok = tokenizer()
    check("tokens", Tokenizer.tokens("The CAT sat, 42 times!") == listOf("the", "cat", "sat", ",", "<num>", "times", "!"))
    check("encode", tok.encode("the dog sat.").toList() == listOf(6, 1, 8, 4)) { tok.encode("the dog sat.").toList().toString() }
    check("message", tok.encodeMessage("cat").toList() == listOf(Tokenizer.BOS, 7))
    check("suggestable", tok.suggestable.toList() == (6..13).toList())
    check("bad vocab", runCatching { Tokenizer(listOf("a", "b")) }.isFailure)
    check("vocab text", Tokenizer.fromVocabText(tok.words.joinToString("") { "$it\n" }).words == tok.words)

    // ranking: "the" (6) -> "cat" (7) gets 100, the rest by their scores
    val scores = FloatArray(tok.size) { it.toFloat() / 10 }
    val model = BigramTable(tok.size, scores)
    val ranker = SuggestionRanker(tok, model, maxContext = 4)
    check("top3", ranker.suggest("I saw the ") == listOf("cat", "there", "then")) { ranker.suggest("I saw the ").toString() }
    check("context", model.lastContext.toList() == listOf(Tokenizer.BOS, 1, 1, 6)) { model.lastContext.toList().toString() }
    check("prefix", ranker.suggest("I saw the Th") == listOf("there", "then", "they")) { ranker.suggest("I saw the Th").toString() }
    check("prefix curly", ranker.suggest("the\u2019") == emptyList<String>())
    check("no specials", ranker.suggest("", k = 20).none { it.startsWith("<") || it in Tokenizer.PUNCTUATION })
    check("max context", SuggestionRanker(tok, model, 3).let { it.suggest("a b c d e the "); model.lastContext.size == 3 })
    check("ties by id", SuggestionRanker.rank(floatArrayOf(1f, 2f, 2f, 0f), listOf(0, 1, 2, 3), 3) == listOf(1, 2, 0))
    check("wrong logits", runCatching { SuggestionRanker(tok, { FloatArray(3) }).suggest("x") }.isFailure)

    // the compiled shape: context in row 0, logits read at its last position
    val shape = CompiledShape(batch = 2, seq = 4, vocab = 3)
    check("input", shape.input(intArrayOf(2, 7)).toList() == listOf(2, 7, 0, 0, 0, 0, 0, 0))
    check("input long", shape.input(intArrayOf(1, 2, 3, 4, 5)).toList().take(4) == listOf(2, 3, 4, 5))
    val out = FloatArray(2 * 4 * 3) { it.toFloat() }
    check("logits at", shape.nextLogits(out, intArrayOf(2, 7)).toList() == listOf(3f, 4f, 5f))
    check("logits long", shape.nextLogits(out, IntArray(9)).toList() == listOf(9f, 10f, 11f))

    // the buffer: bounded, persisted, survives a new instance, wiped by clear
    val dir = tempDir()
    val store = FileBlobStore(File(dir, "buffer.txt"))
    val buf = TrainingBuffer(store, maxSentences = 3, maxChars = 1000)
    listOf("one  two\nthree", " ", "four", "five", "six").forEach(buf::add)
    check("bounded", buf.sentences() == listOf("four", "five", "six")) { buf.sentences().toString() }
    check("untrained", buf.untrained == 3)
    buf.markTrained()
    buf.add("seven")
    val again = TrainingBuffer(store, maxSentences = 3, maxChars = 1000)
    check("restart", again.sentences() == listOf("five", "six", "seven") && again.untrainedSentences() == listOf("seven"))
    check("chars bound", TrainingBuffer(FileBlobStore(File(dir, "c.txt")), 100, 10).run {
        add("12345"); add("67890"); add("abc"); sentences() == listOf("67890", "abc")
    })
    again.clear()
    check("clear file", !File(dir, "buffer.txt").exists() && dir.listFiles()!!.none { it.name.startsWith("buffer") })
    check("clear restart", TrainingBuffer(store).size == 0)
    File(dir, "bad.txt").writeText("garbage\nsecret\n")
    check("foreign file", TrainingBuffer(FileBlobStore(File(dir, "bad.txt"))).size == 0)

    // policy and a training session
    val policy = TrainingPolicy(batch = 2, seq = 4, minNewTokens = 10, passes = 2.0, maxSteps = 5)
    check("policy steps", policy.steps(9, 100) == 0 && policy.steps(10, 8) == 2 && policy.steps(10, 1000) == 5)
    check("charging only", !policy.shouldTrain(100, charging = false) && policy.shouldTrain(100, charging = true))
    val (x, y) = policy.batch(intArrayOf(2, 6, 7, 8, 9, 10, 11), Random(0))
    check("batch shift", x.size == 8 && (0 until 8).all { i -> y[i] == 0 || y[i] == x[i] + 1 || (x[i] == 2 && y[i] == 6) })
    val stats = MemoryStore()
    val buf2 = TrainingBuffer(MemoryStore())
    val pz = Personalizer(tok, buf2, policy, stats)
    buf2.add("the cat sat")
    val trainer = MeanTrainer()
    check("not enough", pz.trainIfReady(trainer, charging = true, nowMillis = 1) == 0 && trainer.steps == 0)
    buf2.add("the cat sat on the mat. then they sat there.")
    check("not charging", pz.trainIfReady(trainer, charging = false, nowMillis = 2) == 0)
    val ran = pz.trainIfReady(trainer, charging = true, nowMillis = 1234)
    check("session", ran == 5 && trainer.steps == 5 && trainer.shapes == setOf(8) && buf2.untrained == 0)
    check("stats", pz.stats.let { it.steps == 5L && it.lastTrainedMillis == 1234L && it.sentencesLearned == 2L && !it.lastLoss.isNaN() })
    check("stats codec", LearningStats.decode(LearningStats(3, 1.5f, 9, 4).encode()) == LearningStats(3, 1.5f, 9, 4))
    check("again not ready", pz.trainIfReady(trainer, charging = true, nowMillis = 5) == 0)
    val seeded = List(2) {
        val b = TrainingBuffer(MemoryStore()).apply { add("the cat sat on the mat. then they sat there, the cat.") }
        val t = MeanTrainer()
        Personalizer(tok, b, policy, MemoryStore()).trainIfReady(t, charging = true, nowMillis = 7, seed = 42)
        t.m
    }
    check("seeded session", seeded[0] == seeded[1] && seeded[0] != 0f)
    pz.forget()
    check("forget", buf2.size == 0 && pz.stats == LearningStats() && stats.read() == null)
    dir.deleteRecursively()
}

private class MemoryStore : BlobStore {
    private var text: String? = null
    override fun read() = text
    override fun write(text: String) { this.text = text }
    override fun delete() { text = null }
}

fun tokenizeVectors(vocab: File, vectors: File) {
    val tok = Tokenizer.fromVocabText(vocab.readText())
    for (line in vectors.readLines()) {
        val (text, tokens, ids) = line.split("\t")
        val t = unescape(text)
        check("tokens ${line.take(40)}", Tokenizer.tokens(t).joinToString(" ") == tokens) { "got ${Tokenizer.tokens(t)}" }
        check("ids ${line.take(40)}", tok.encode(t).toList() == ints(ids)) { "got ${tok.encode(t).toList()}" }
    }
}

fun main(args: Array<String>) {
    when (args.firstOrNull()) {
        "selftest" -> selftest()
        "tokenize" -> tokenizeVectors(File(args[1]), File(args[2]))
        "policy" -> { // policy <newTokens> <buffered> ...: default policy's steps, one per line
            args.drop(1).chunked(2).forEach { (n, b) -> println(TrainingPolicy().steps(n.toInt(), b.toInt())) }
            return
        }
        "buffer-add" -> { TrainingBuffer(FileBlobStore(File(args[1]))).let { b -> args.drop(2).forEach(b::add) }; return }
        "buffer-dump" -> {
            val b = TrainingBuffer(FileBlobStore(File(args[1])))
            println("untrained=${b.untrained}")
            b.sentences().forEach(::println)
            return
        }
        "buffer-clear" -> { TrainingBuffer(FileBlobStore(File(args[1]))).clear(); return }
        else -> { System.err.println("usage: selftest | tokenize VOCAB TSV | policy N B.. | buffer-add|dump|clear FILE"); exitProcess(2) }
    }
    failures.forEach { println("FAIL $it") }
    println("kotlin: $passed passed, ${failures.size} failed")
    if (failures.isNotEmpty()) exitProcess(1)
}
