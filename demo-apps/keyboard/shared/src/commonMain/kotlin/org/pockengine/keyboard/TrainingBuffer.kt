package org.pockengine.keyboard

/** Where a small piece of app state lives (a private file on the phone). */
interface BlobStore {
    fun read(): String?
    fun write(text: String)   // atomically: the old text or the new one survives a crash
    fun delete()
}

/**
 * The user's typed sentences, kept only on the device for training: bounded (the oldest
 * go first), persisted on every change, wiped by [clear]. [untrained] counts the newest
 * sentences not trained on yet.
 */
class TrainingBuffer(
    private val store: BlobStore,
    val maxSentences: Int = 2000,
    val maxChars: Int = 200_000,
) {
    private val sentences = ArrayDeque<String>()
    private var chars = 0
    var untrained = 0
        private set

    init {
        load()
    }

    val size: Int get() = sentences.size

    fun sentences(): List<String> = sentences.toList()

    fun untrainedSentences(): List<String> = sentences.toList().takeLast(untrained)

    /** Adds one typed sentence (whitespace collapsed; blank text is ignored). */
    fun add(sentence: String) {
        val text = sentence.trim().split(WHITESPACE).joinToString(" ")
        if (text.isEmpty()) return
        sentences.addLast(text.take(maxChars))
        chars += sentences.last().length
        untrained++
        while (sentences.size > maxSentences || chars > maxChars) chars -= sentences.removeFirst().length
        untrained = minOf(untrained, sentences.size)
        save()
    }

    fun markTrained() {
        untrained = 0
        save()
    }

    /** Forgets everything the user typed, in memory and on disk. */
    fun clear() {
        sentences.clear()
        chars = 0
        untrained = 0
        store.delete()
    }

    private fun save() = store.write(buildString {
        append(HEADER).append(' ').append(untrained).append('\n')
        for (s in sentences) append(s).append('\n')
    })

    private fun load() {
        val lines = store.read()?.split("\n") ?: return
        val header = lines.first().split(" ")
        if (header.size != 2 || header[0] != HEADER) return   // not ours or damaged: start empty
        for (s in lines.drop(1)) if (s.isNotEmpty()) sentences.addLast(s)
        while (sentences.size > maxSentences) sentences.removeFirst()
        chars = sentences.sumOf { it.length }
        untrained = (header[1].toIntOrNull() ?: 0).coerceIn(0, sentences.size)
    }

    companion object {
        const val HEADER = "pock-keyboard-buffer/1"
        private val WHITESPACE = Regex("\\s+")
    }
}
