package org.pockengine.keyboard.app

import ai.pockengine.PockTokenizer
import ai.pockengine.PockTrainer
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.LanguageModel
import org.pockengine.keyboard.TextTokenizer
import java.io.File

/**
 * Smart compose's LLM over the SDK (the shared SmartCompose calls it): [TextTokenizer] with
 * `PockTokenizer.encode/decode`, and [LanguageModel] with `PockTrainer.forward` / `step` at the
 * compiled 1 x seq shape (through [PockKeyboardModel]), `generate` (greedy, the streaming
 * onToken stop) and `exportAdapter`. [trainer] is asked on every call, as in PockKeyboardModel.
 * Plain Kotlin (no android.*): tests/demo/test_smart_compose_jvm.py runs it on the JVM.
 */
class PockLanguageModel(
    private val tokenizer: PockTokenizer,
    shape: CompiledShape,
    private val trainer: () -> PockTrainer,
) : LanguageModel, TextTokenizer {
    private val compiled = PockKeyboardModel(shape, trainer)

    override fun encode(text: String): IntArray = tokenizer.encode(text, addSpecialTokens = false)

    override fun decode(ids: IntArray): String = tokenizer.decode(ids)

    override fun nextLogits(context: IntArray): FloatArray = compiled.nextLogits(context)

    override fun step(x: IntArray, y: IntArray): Float = compiled.step(x, y)

    override fun generate(prompt: IntArray, maxNewTokens: Int, onToken: (Int) -> Boolean): IntArray =
        trainer().generate(prompt, maxNewTokens = maxNewTokens, onToken = onToken)

    override fun exportAdapter(path: String, format: String) = trainer().exportAdapter(File(path), format)
}
