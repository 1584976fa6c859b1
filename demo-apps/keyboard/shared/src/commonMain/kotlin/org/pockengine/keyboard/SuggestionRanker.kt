package org.pockengine.keyboard

/**
 * The model behind the suggestion strip. The apps implement it with the SDK's
 * `PockTrainer.forward` on the current (personalized) weights, see [CompiledShape].
 */
fun interface NextWordModel {
    /** Logits over the vocabulary for the word after [context] (ids, oldest first). */
    fun nextLogits(context: IntArray): FloatArray
}

/**
 * The compiled program's fixed input shape (batch x seq ids). A context is placed in row 0
 * from position 0 and padded; the model is causal (an LSTM), so the logits at the
 * context's last position do not depend on the padding.
 */
class CompiledShape(val batch: Int, val seq: Int, val vocab: Int) {
    fun input(context: IntArray): IntArray {
        val ids = IntArray(batch * seq) { Tokenizer.PAD }
        context.takeLast(seq).forEachIndexed { i, id -> ids[i] = id }
        return ids
    }

    /** The logits of [context]'s last word in the model's output (batch x seq x vocab). */
    fun nextLogits(output: FloatArray, context: IntArray): FloatArray {
        require(output.size == batch * seq * vocab) { "output has ${output.size} values, expected ${batch * seq * vocab}" }
        val pos = minOf(context.size, seq) - 1
        require(pos >= 0) { "empty context" }
        return output.copyOfRange(pos * vocab, (pos + 1) * vocab)
    }
}

/**
 * Top-k next-word suggestions for the text before the cursor: the context is <s> and the
 * complete words typed (the last [maxContext] tokens); a word being typed (letters right
 * before the cursor) restricts the candidates to words it begins.
 */
class SuggestionRanker(
    private val tokenizer: Tokenizer,
    private val model: NextWordModel,
    private val maxContext: Int = 16,
) {
    fun suggest(textBeforeCursor: String, k: Int = 3): List<String> {
        val partial = PARTIAL.find(textBeforeCursor)?.value ?: ""
        val complete = textBeforeCursor.substring(0, textBeforeCursor.length - partial.length)
        val context = (intArrayOf(Tokenizer.BOS) + tokenizer.encode(complete)).takeLast(maxContext).toIntArray()
        val logits = model.nextLogits(context)
        require(logits.size == tokenizer.size) { "the model returned ${logits.size} logits for ${tokenizer.size} words" }
        val prefix = Tokenizer.normalize(partial)
        return rank(logits, tokenizer.suggestable.filter { tokenizer.words[it].startsWith(prefix) }, k)
            .map { tokenizer.words[it] }
    }

    companion object {
        private val PARTIAL = Regex("[A-Za-z'\u2018\u2019]+$")

        /** The k candidate ids with the highest logits, best first (ties: lower id first). */
        fun rank(logits: FloatArray, candidates: List<Int>, k: Int): List<Int> =
            candidates.sortedWith(compareByDescending<Int> { logits[it] }.thenBy { it }).take(k)
    }
}
