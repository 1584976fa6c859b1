// The LLM loop of the Kotlin SDK on the JVM, driven by test_jvm_llm.py: a tiny Llama with LoRA
// adapters over a host build of its library with pock_jni.cpp, and a byte-level BPE.
//
//   java -cp core:this:stdlib:coroutines LlmJvmTestKt BUNDLE LIBRARY TOKENIZER WORK TEXT PROMPT
//
// TEXT: the training text (UTF-8 file); PROMPT: the generation prompt (a string).
// PockTokenizer.encode -> step (3, then an all-ignored batch, then 2) -> generate (greedy,
// streamed, stopped, sampled) -> exportAdapter; then every misuse.  Prints one "key value" line
// per fact; exits 1 on an unexpected exception.
import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockTensor
import ai.pockengine.PockTokenizer
import ai.pockengine.PockTrainer
import java.io.File

fun say(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

fun ids(a: IntArray) = a.joinToString(" ")

fun expectError(what: String, block: () -> Unit) {
    try {
        block()
    } catch (e: PockException) {
        say("error.$what", "${e.status} ${e.message}")
        return
    }
    throw AssertionError("$what: no PockException")
}

fun main(args: Array<String>) {
    val (bundle, library, tokenizer, work) = args.take(4).map(::File)
    val text = File(args[4]).readText(Charsets.UTF_8)
    val options = PockOptions(libraryFile = library)
    val trainer = PockTrainer.open(bundle, options)
    val tok = PockTokenizer.open(tokenizer)
    val seq = trainer.inputs[0].shape[1]
    val all = tok.encode(text)
    say("ids", ids(all.copyOf(seq + 1)))
    val x = PockTensor.of(LongArray(seq) { all[it].toLong() }, 1, seq)
    val y = PockTensor.of(LongArray(seq) { all[it + 1].toLong() }, 1, seq)
    val prompt = tok.encode(args[5])
    say("prompt", ids(prompt))
    say("can_generate", trainer.canGenerate)
    say("greedy_before", ids(trainer.generate(prompt, maxNewTokens = 12)))

    val losses = ArrayList<Float>()
    repeat(3) { losses.add(trainer.step(x, y)) }

    // a batch with no real target: skipped and counted, nothing moves (strict or not)
    val lora = trainer.stateTensors.first { it.name.endsWith(".lora_B") }.name
    val before = trainer.getTensor(lora).toFloatArray()
    val stepsBefore = trainer.stepCount
    val ignored = PockTensor.of(LongArray(seq) { -100L }, 1, seq)
    say("skip_loss", trainer.step(x, ignored))
    say("skip_status", trainer.lastStepStatus)
    say("skip_message", trainer.lastStepMessage)
    say("skipped_steps", trainer.skippedSteps)
    say("skip_state_kept", trainer.getTensor(lora).toFloatArray().contentEquals(before) && trainer.stepCount == stepsBefore)
    PockTrainer.open(bundle, options.copy(strict = true)).use { strict ->
        strict.step(x, ignored)
        say("strict_skip", "${strict.lastStepStatus} ${strict.skippedSteps}")
    }

    repeat(2) { losses.add(trainer.step(x, y)) }
    say("after_skip_status", trainer.lastStepStatus)
    say("losses", losses.joinToString(" "))
    say("step_count", trainer.stepCount)

    val greedy = trainer.generate(prompt, maxNewTokens = 16)
    say("greedy", ids(greedy))
    val streamed = ArrayList<Int>()
    val five = trainer.generate(prompt, maxNewTokens = 16, onToken = { streamed.add(it); streamed.size == 5 })
    say("streamed", "${ids(five)} | ${streamed.joinToString(" ")}")
    say("stopped", ids(trainer.generate(prompt, maxNewTokens = 16, stop = intArrayOf(greedy[3]))))
    say("stop_id", greedy[3])
    val sampled = trainer.generate(prompt, maxNewTokens = 16, temperature = 1f, topK = 20, topP = 0.9f, seed = 7)
    say("sampled", ids(sampled))
    say("sampled_again_equal",
        trainer.generate(prompt, maxNewTokens = 16, temperature = 1f, topK = 20, topP = 0.9f, seed = 7).contentEquals(sampled))
    say("none", trainer.generate(prompt, maxNewTokens = 0).size)

    trainer.exportAdapter(File(work, "peft"))
    try {
        trainer.exportAdapter(File(work, "adapter.gguf"), format = "gguf")
        say("gguf", "written")
    } catch (e: PockException) {
        say("gguf", "${e.status} ${e.message}")
    }

    // misuse: a PockException naming the problem, the trainer still usable
    expectError("empty_prompt") { trainer.generate(IntArray(0)) }
    expectError("out_of_vocab") { trainer.generate(intArrayOf(prompt[0], tok.vocabSize)) }
    expectError("negative_new") { trainer.generate(prompt, maxNewTokens = -1) }
    expectError("past_context") { trainer.generate(prompt, maxNewTokens = 1000) }
    expectError("huge_new") { trainer.generate(prompt, maxNewTokens = Int.MAX_VALUE) }
    expectError("top_p") { trainer.generate(prompt, topP = 0f) }
    expectError("temperature") { trainer.generate(prompt, temperature = Float.NaN) }
    expectError("top_k") { trainer.generate(prompt, topK = -1) }
    expectError("format") { trainer.exportAdapter(File(work, "x"), format = "onnx") }
    File(work, "blocker").writeText("")
    expectError("unwritable") { trainer.exportAdapter(File(work, "blocker/peft")) }
    expectError("reentrant_step") { trainer.generate(prompt, maxNewTokens = 4, onToken = { trainer.step(x, y); false }) }
    expectError("reentrant_close") { trainer.generate(prompt, maxNewTokens = 4, onToken = { trainer.close(); false }) }
    try {
        trainer.generate(prompt, maxNewTokens = 8, onToken = { throw IllegalStateException("boom at $it") })
        say("listener_throws", "no exception")
    } catch (e: IllegalStateException) {
        say("listener_throws", e.message)
    }
    say("usable_after_errors", trainer.generate(prompt, maxNewTokens = 16).contentEquals(greedy) && trainer.stepCount == 5L)
    say("decoded", tok.decode(greedy))

    // generation while another thread trains on the same trainer: serialized by its lock
    val trainer2 = Thread { repeat(3) { trainer.step(x, y) } }
    val lengths = ArrayList<Int>()
    trainer2.start()
    repeat(5) { lengths.add(trainer.generate(prompt, maxNewTokens = 8).size) }
    trainer2.join()
    say("concurrent", "${trainer.stepCount} ${lengths.joinToString(" ")}")
    say("greedy_8_steps", ids(trainer.generate(prompt, maxNewTokens = 16)))
    trainer.close()
    expectError("closed") { trainer.generate(prompt) }
    tok.close()
    say("done", true)
}
