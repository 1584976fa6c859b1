package org.pockengine.keyboard

/** The LLM's tokenizer: the SDK's `PockTokenizer` in the apps (encode without special tokens). */
interface TextTokenizer {
    fun encode(text: String): IntArray
    fun decode(ids: IntArray): String
}

/**
 * The personalized LLM (a causal LM with LoRA adapters compiled at 1 x seq tokens) over the
 * SDK's `PockTrainer`: [nextLogits] is `forward` at the compiled shape ([CompiledShape] with
 * batch 1), [step] is `step` (labels [SmartCompose.IGNORE] where there is no target), and:
 */
interface LanguageModel : NextWordModel, StepTrainer {
    /** `PockTrainer.generate`, greedy: up to [maxNewTokens] ids after [prompt]; [onToken] sees
     *  each new id as it comes, true stops after it (the streaming callback). */
    fun generate(prompt: IntArray, maxNewTokens: Int, onToken: (Int) -> Boolean): IntArray

    /** `PockTrainer.exportAdapter`: "peft" (a folder) or "gguf" (a llama.cpp LoRA file). */
    fun exportAdapter(path: String, format: String)
}

/**
 * Smart compose on the keyboard (sim/smart_compose.py's Suggester and training stream, the same
 * rules): the user's typed sentences train the LLM's LoRA adapters, and the strip shows the
 * next words it completes.
 *
 * - [learn]: a sentence's ids join one stream (sentences separated by a space, as Python's
 *   `tok.encode(" ".join(typed))`); every [seq] + 1 buffered ids make one step on
 *   (ids[0, seq), ids[1, seq]), and the next window starts [seq] ids on. [flush] trains what is
 *   left, right-padded with [IGNORE] labels; a remainder without a target is dropped (the SDK
 *   would skip that batch).
 * - [suggest]: the model's most likely word-starting tokens after the text (the first
 *   [candidates] ids by logit; with a word being typed, the ones that agree with it), each
 *   completed greedily by `generate` with a streaming stop at the first token that starts the
 *   next word (at most [maxWordTokens] more), decoded to whole words, distinct, best first.
 */
class SmartCompose(
    private val tokenizer: TextTokenizer,
    private val model: LanguageModel,
    val seq: Int,
    private val candidates: Int = 200,
    private val maxWordTokens: Int = 4,
) {
    private val pending = ArrayList<Int>()
    private val startsWord = HashMap<Int, Boolean>()
    private var joined = false

    /** Training steps run so far, and their losses (the newest last). */
    var steps = 0
        private set
    val losses = ArrayList<Float>()

    /** Ids buffered for the next step. */
    val buffered: Int get() = pending.size

    /** Adds one typed sentence to the training stream; returns the steps it ran. */
    fun learn(sentence: String): Int {
        val text = sentence.trim()
        if (text.isEmpty()) return 0
        pending.addAll(tokenizer.encode(if (joined) " $text" else text).asIterable())
        joined = true
        var ran = 0
        while (pending.size >= seq + 1) {
            train(IntArray(seq) { pending[it] }, IntArray(seq) { pending[it + 1] })
            pending.subList(0, seq).clear()
            ran++
        }
        return ran
    }

    /** Trains on what is buffered (padded, the padding's labels [IGNORE]); returns the steps run. */
    fun flush(): Int {
        val n = pending.size
        val ran = if (n >= 2) {
            train(IntArray(seq) { if (it < n - 1) pending[it] else PAD }, IntArray(seq) { if (it < n - 1) pending[it + 1] else IGNORE })
            1
        } else 0
        pending.clear()
        return ran
    }

    /** Up to [k] distinct whole-word suggestions for the text before the cursor, best first. */
    fun suggest(textBeforeCursor: String, k: Int = 3): List<String> {
        val partial = PARTIAL.find(textBeforeCursor)?.value ?: ""
        val complete = textBeforeCursor.substring(0, textBeforeCursor.length - partial.length).trimEnd()
        if (complete.isEmpty()) return emptyList()
        val context = tokenizer.encode(complete).takeLast(seq).toIntArray()
        if (context.isEmpty()) return emptyList()
        return suggestAfter(context, model.nextLogits(context), partial, k)
    }

    /** [suggest] from ids: [logits] are the model's next-token logits after [context]. */
    fun suggestAfter(context: IntArray, logits: FloatArray, partial: String = "", k: Int = 3): List<String> {
        val typed = " $partial"
        val order = logits.indices.sortedWith(compareByDescending<Int> { logits[it] }.thenBy { it })
        val firsts = order.take(if (partial.isEmpty()) candidates else order.size).filter { startsWord(it) }
        val out = ArrayList<String>()
        for (first in firsts) {
            if (partial.isNotEmpty()) {
                val piece = tokenizer.decode(intArrayOf(first))
                if (!typed.startsWith(piece, ignoreCase = true) && !piece.startsWith(typed, ignoreCase = true)) continue
            }
            val w = completeWord(context, first)
            if (w.isNotEmpty() && w !in out && w.startsWith(partial.lowercase())) out.add(w)
            if (out.size == k) break
        }
        return out
    }

    /** The word that starts with token [first] after [context], completed greedily until the next word starts. */
    fun completeWord(context: IntArray, first: Int): String {
        val new = model.generate(context + first, maxWordTokens) { startsWord(it) }
        val cut = new.indexOfFirst { startsWord(it) }.let { if (it < 0) new.size else it }
        return word(tokenizer.decode(intArrayOf(first) + new.copyOf(cut)))
    }

    /** Whether a token begins a new word (its text starts with a space). */
    fun startsWord(token: Int): Boolean = startsWord.getOrPut(token) { tokenizer.decode(intArrayOf(token)).startsWith(" ") }

    /** Writes the trained LoRA adapters ("peft": adapter_model.safetensors + adapter_config.json). */
    fun exportAdapter(path: String, format: String = "peft") = model.exportAdapter(path, format)

    private fun train(x: IntArray, y: IntArray) {
        losses.add(model.step(x, y))
        steps++
    }

    companion object {
        /** The loss's ignore_index: a label without a target. */
        const val IGNORE = -100
        const val PAD = 0
        private val PARTIAL = Regex("[\\p{L}\\p{M}\\p{N}_'\u2019-]+$")
        private val WORD = Regex("^\\s*([\\p{L}\\p{M}\\p{N}_'-]+)")

        /** The word a completion starts with, lower case (Python's `_word`). */
        fun word(text: String): String = WORD.find(text)?.groupValues?.get(1)?.lowercase() ?: text.trim().lowercase()
    }
}
