package org.pockengine.keyboard

/**
 * Word-level tokenizer of the keyboard model: the same algorithm as
 * model/tokenizer.py (tests/demo checks both on testdata/tokenizer_vectors.tsv).
 *
 * 1. curly apostrophes (U+2018, U+2019) become ';  2. ASCII A-Z become a-z, nothing else
 * changes case;  3. tokens are the matches of [TOKEN_PATTERN] in order;  4. a digit run is
 * <num>, a word not in the vocabulary <unk>. A message is <s> followed by its tokens.
 */
class Tokenizer(val words: List<String>) {
    private val ids: Map<String, Int> = words.withIndex().associate { (i, w) -> w to i }

    /** Ids a suggestion strip may show: real words (no specials, no punctuation). */
    val suggestable: IntArray = words.indices.filter { it >= SPECIALS.size && words[it] !in PUNCTUATION }.toIntArray()

    init {
        require(words.take(SPECIALS.size) == SPECIALS) { "a keyboard vocabulary starts with $SPECIALS" }
    }

    val size: Int get() = words.size

    fun id(word: String): Int = ids[word] ?: UNK

    fun encode(text: String): IntArray = tokens(text).map { id(it) }.toIntArray()

    fun encodeMessage(text: String): IntArray = intArrayOf(BOS) + encode(text)

    fun decode(ids: IntArray): List<String> = ids.map { words[it] }

    companion object {
        val SPECIALS = listOf("<pad>", "<unk>", "<s>", "<num>")
        const val PAD = 0
        const val UNK = 1
        const val BOS = 2
        const val NUM = 3
        val PUNCTUATION = setOf(".", ",", "!", "?", ";", ":")
        const val TOKEN_PATTERN = "[a-z]+(?:'[a-z]+)*|[0-9]+|[.,!?;:]"
        private val TOKEN = Regex(TOKEN_PATTERN)

        fun normalize(text: String): String = buildString(text.length) {
            for (c in text) append(
                when (c) {
                    '\u2018', '\u2019' -> '\''
                    in 'A'..'Z' -> c + 32
                    else -> c
                },
            )
        }

        fun tokens(text: String): List<String> =
            TOKEN.findAll(normalize(text)).map { if (it.value[0] in '0'..'9') "<num>" else it.value }.toList()

        /** vocab.txt's text: one word a line, each line ending in \n. */
        fun fromVocabText(text: String): Tokenizer = Tokenizer(text.split("\n").dropLast(1))
    }
}
