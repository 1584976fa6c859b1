package ai.pockengine

import java.io.Closeable
import java.io.File

/** The JNI surface of the tokenizer (the PockTokenizer block of pock_jni.cpp). */
internal object PockTokenizerNative {
    @JvmStatic external fun open(path: String): Long
    @JvmStatic external fun openBytes(data: ByteArray): Long
    @JvmStatic external fun close(handle: Long)
    @JvmStatic external fun encode(handle: Long, utf8: ByteArray, addSpecialTokens: Boolean): IntArray
    @JvmStatic external fun decode(handle: Long, ids: IntArray, skipSpecialTokens: Boolean): ByteArray
    /** {vocab size, bos, eos, pad}, -1 where there is none. */
    @JvmStatic external fun info(handle: Long): IntArray
    @JvmStatic external fun tokenToId(handle: Long, utf8: ByteArray): Int
}

/**
 * Text <-> token ids with the runtime's tokenizer (pock.h `pock_tokenizer_*`): the same
 * ids as Hugging Face `tokenizers` and as Python's `pe.Tokenizer`, from a tokenizer.json,
 * a folder holding one, or a GGUF file.
 *
 * The tokenizer lives in every model library: open a [PockTrainer] first (it loads the
 * library), or pass the library file to [open].  Calls are serialised on the tokenizer,
 * so one may be shared between threads; errors throw [PockException].
 */
class PockTokenizer private constructor(handle: Long) : Closeable {
    private var handle: Long = handle
    private val lock = Any()

    /** Tokens in the vocabulary (added tokens included). */
    val vocabSize: Int
    val bosId: Int?
    val eosId: Int?
    val padId: Int?

    init {
        val info = PockTokenizerNative.info(handle)
        vocabSize = info[0]
        bosId = info[1].takeIf { it >= 0 }
        eosId = info[2].takeIf { it >= 0 }
        padId = info[3].takeIf { it >= 0 }
    }

    companion object {
        /** From a tokenizer.json, a folder holding one (and tokenizer_config.json), or a .gguf file. */
        @JvmStatic
        @JvmOverloads
        fun open(path: File, libraryFile: File? = null): PockTokenizer {
            loadLibrary(libraryFile)
            return PockTokenizer(PockTokenizerNative.open(path.path))
        }

        /** From the bytes of a tokenizer.json or a GGUF file (e.g. an app asset). */
        @JvmStatic
        @JvmOverloads
        fun fromBytes(data: ByteArray, libraryFile: File? = null): PockTokenizer {
            loadLibrary(libraryFile)
            return PockTokenizer(PockTokenizerNative.openBytes(data))
        }

        private fun loadLibrary(libraryFile: File?) {
            if (libraryFile == null) return
            try {
                System.load(libraryFile.absolutePath)
            } catch (e: UnsatisfiedLinkError) {
                throw PockException(PockStatus.IO, "cannot load the native library '${libraryFile.path}': ${e.message}", e)
            }
        }
    }

    private inline fun <T> live(what: String, body: (Long) -> T): T = synchronized(lock) {
        if (handle == 0L) throw PockException(PockStatus.CLOSED, "$what: the tokenizer is closed")
        body(handle)
    }

    /** Token ids of [text]; [addSpecialTokens]: the tokenizer's own (e.g. Llama's BOS), as Hugging Face does. */
    @JvmOverloads
    fun encode(text: String, addSpecialTokens: Boolean = true): IntArray =
        live("encode") { PockTokenizerNative.encode(it, text.toByteArray(Charsets.UTF_8), addSpecialTokens) }

    /** Text of [ids]; an id outside the vocabulary throws PockException(VALUE) naming it. */
    @JvmOverloads
    fun decode(ids: IntArray, skipSpecialTokens: Boolean = false): String =
        live("decode") { String(PockTokenizerNative.decode(it, ids, skipSpecialTokens), Charsets.UTF_8) }

    /** The id of [token], or null when it is not in the vocabulary. */
    fun tokenToId(token: String): Int? =
        live("tokenToId") { PockTokenizerNative.tokenToId(it, token.toByteArray(Charsets.UTF_8)).takeIf { id -> id >= 0 } }

    override fun close() = synchronized(lock) {
        if (handle != 0L) {
            PockTokenizerNative.close(handle)
            handle = 0L
        }
    }
}
