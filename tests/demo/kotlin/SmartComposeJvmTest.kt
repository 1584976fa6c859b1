// Smart compose of the keyboard app on the JVM: the shared SmartCompose (demo-apps/keyboard/shared)
// over the Android app's adapter (PockLanguageModel.kt: PockTokenizer + PockTrainer forward / step /
// generate / exportAdapter) and a host JNI build of a tiny Llama with LoRA adapters. Driven by
// tests/demo/test_smart_compose_jvm.py:
//
//   java -cp sdk.jar:this.jar:kotlin-stdlib.jar org.pockengine.keyboard.tests.SmartComposeJvmTestKt \
//        BUNDLE_DIR LIBRARY TOKENIZER TYPED PROBES WORK_DIR
//
// TYPED: the user's sentences, one a line (learned in order, then flushed); PROBES: texts before
// the cursor, one a line (suggested for before and after learning). Prints "key value" facts.
package org.pockengine.keyboard.tests

import ai.pockengine.PockOptions
import ai.pockengine.PockTokenizer
import ai.pockengine.PockTrainer
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.SmartCompose
import org.pockengine.keyboard.app.PockLanguageModel
import java.io.File

private fun fact(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

fun main(args: Array<String>) {
    val (bundle, library, tokenizerFile) = args.take(3).map(::File)
    val typed = File(args[3]).readLines(Charsets.UTF_8).filter { it.isNotEmpty() }
    val probes = File(args[4]).readLines(Charsets.UTF_8).filter { it.isNotEmpty() }
    val work = File(args[5])
    val trainer = PockTrainer.open(bundle, PockOptions(libraryFile = library))
    val tok = PockTokenizer.open(tokenizerFile)
    val seq = trainer.inputs[0].shape[1]
    val lm = PockLanguageModel(tok, CompiledShape(1, seq, tok.vocabSize)) { trainer }
    val compose = SmartCompose(lm, lm, seq)
    fact("seq", seq)

    probes.forEachIndexed { i, p -> fact("before.$i", compose.suggest(p).joinToString(",")) }
    val perSentence = typed.map { compose.learn(it) }
    fact("learn_steps", perSentence.joinToString(" "))
    fact("buffered", compose.buffered)
    fact("losses", compose.losses.joinToString(" "))
    probes.forEachIndexed { i, p -> fact("after.$i", compose.suggest(p).joinToString(",")) }
    // a word being typed: completions of it only
    probes.forEachIndexed { i, p -> fact("partial.$i", compose.suggest(p + "th").joinToString(",")) }
    fact("empty", compose.suggest("").size)
    fact("flush", compose.flush())
    fact("flush_loss", compose.losses.last())
    fact("flush_again", compose.flush())
    probes.forEachIndexed { i, p -> fact("flushed.$i", compose.suggest(p).joinToString(",")) }
    compose.exportAdapter(File(work, "peft").path)
    compose.learn("a")   // one id: no target, dropped by flush without a step
    fact("flush_one", "${compose.flush()} ${compose.steps} ${trainer.stepCount} ${trainer.skippedSteps}")
    fact("step_count", trainer.stepCount)
    trainer.close()
    tok.close()
    fact("done", true)
}
