// TokenizerJvmTest.kt — drives PockTokenizer (sdk-android) on the JVM for test_jvm_tokenizer.py.
import ai.pockengine.PockException
import ai.pockengine.PockTokenizer
import java.io.File

// args: tokenizer path, JNI library, a UTF-8 text file; prints "key value" lines.
fun main(args: Array<String>) {
    val tok = PockTokenizer.open(File(args[0]), File(args[1]))
    println("vocab_size ${tok.vocabSize}")
    println("specials ${tok.bosId} ${tok.eosId} ${tok.padId}")
    val text = File(args[2]).readText(Charsets.UTF_8)
    val ids = tok.encode(text)
    println("ids ${ids.joinToString(" ")}")
    println("round_trip ${tok.decode(ids) == text}")
    println("im_start ${tok.tokenToId("<|im_start|>")}")
    try {
        tok.decode(intArrayOf(5, tok.vocabSize))
    } catch (e: PockException) {
        println("error.out_of_vocab ${e.status} ${e.message}")
    }
    tok.close()
    try {
        tok.encode("x")
    } catch (e: PockException) {
        println("error.closed ${e.status} ${e.message}")
    }
    try {
        PockTokenizer.open(File("/nowhere/tokenizer.json"))
    } catch (e: PockException) {
        println("error.missing ${e.status} ${e.message}")
    }
    println("done true")
}
