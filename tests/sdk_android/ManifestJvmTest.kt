// Tampered model bundles against the Kotlin SDK, driven by test_manifest.py:
//
//   java -cp core.jar:this.jar:kotlin-stdlib.jar ManifestJvmTestKt CASES_DIR LIBRARY FUZZ_SECONDS
//
// Opens every bundle directory under CASES_DIR (PockTrainer.open with the host
// library) and prints "case.<name> OK" or "case.<name> <exception class> <status> <message>";
// anything but a PockException (StackOverflowError, OutOfMemoryError, ClassCastException,
// NegativeArraySizeException...) is printed with its class for the Python side to reject.
// Then fuzzes ModelBundle.parse (the manifest reader: MiniJson + the schema) with mutations
// of CASES_DIR/ok/model.json for FUZZ_SECONDS (at most 200000 inputs): prints how many inputs
// ran, how many parsed, and the first input that threw anything but a PockException.
import ai.pockengine.ModelBundle
import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockTrainer
import java.io.File
import kotlin.random.Random

fun report(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ').take(2000)}")

fun outcome(block: () -> Unit): String = try {
    block()
    "OK"
} catch (e: PockException) {
    "PockException ${e.status} ${e.message}"
} catch (e: Throwable) {
    "${e.javaClass.name} ${e.message}"
}

// Pieces a mutation splices in: JSON syntax, type confusions, bounds.
val TOKENS = listOf(
    "{", "}", "[", "]", ",", ":", "\"", "\\", "null", "true", "-1", "0", "4294967302", "46340", "1e400",
    "99999999999999999999", "-0", "1.5", "\"x\"", "[]", "{}", "\"..\"", "\"/etc/passwd\"", "\"../w\"", "\\u0000",
    "\"shape\"", "\"dtype\"", "\"prefix\"", "\"weights\"", "\"inputs\"", "\"outputs\"", "[[[[[[[[", "]]]]]]]]",
)

fun mutate(seed: String, rng: Random): String {
    val sb = StringBuilder(seed)
    repeat(1 + rng.nextInt(4)) {
        val at = if (sb.isEmpty()) 0 else rng.nextInt(sb.length + 1)
        when (rng.nextInt(6)) {
            0 -> if (at < sb.length) sb.setCharAt(at, (sb[at].code xor (1 shl rng.nextInt(7))).toChar())
            1 -> sb.insert(at, TOKENS[rng.nextInt(TOKENS.size)])
            2 -> if (sb.isNotEmpty()) sb.delete(at.coerceAtMost(sb.length - 1), (at + 1 + rng.nextInt(16)).coerceAtMost(sb.length))
            3 -> if (sb.isNotEmpty()) {  // duplicate a slice
                val from = rng.nextInt(sb.length)
                sb.insert(at, sb.substring(from, (from + 1 + rng.nextInt(64)).coerceAtMost(sb.length)))
            }
            4 -> {  // replace a number with a hostile one
                val m = Regex("-?[0-9]+").findAll(sb).toList()
                if (m.isNotEmpty()) {
                    val r = m[rng.nextInt(m.size)].range
                    sb.replace(r.first, r.last + 1, listOf("-3", "0", "4294967302", "2147483648", "46340", "1e9", "-0")[rng.nextInt(7)])
                }
            }
            else -> {  // replace a string value with another type
                val m = Regex("\"[a-z_]*\": \"[^\"]*\"").findAll(sb).toList()
                if (m.isNotEmpty()) {
                    val r = m[rng.nextInt(m.size)].range
                    val key = sb.substring(r.first, sb.indexOf(":", r.first))
                    sb.replace(r.first, r.last + 1, "$key: ${TOKENS[rng.nextInt(TOKENS.size)]}")
                }
            }
        }
    }
    return sb.toString()
}

fun main(args: Array<String>) {
    val cases = File(args[0])
    val library = File(args[1])
    val fuzzSeconds = args[2].toDouble()
    for (dir in cases.listFiles()!!.filter { it.isDirectory }.sortedBy { it.name }) {
        report("case.${dir.name}", outcome {
            PockTrainer.open(dir, PockOptions(libraryFile = library)).use { }
        })
    }

    val ok = File(cases, "ok")
    val seed = File(ok, "model.json").readText()
    val rng = Random(20261201)
    val deadline = System.nanoTime() + (fuzzSeconds * 1e9).toLong()
    var runs = 0
    var parsed = 0
    var firstBad: String? = null
    while (runs < 200000 && System.nanoTime() < deadline) {
        val text = mutate(seed, rng)
        runs++
        try {
            ModelBundle.parse(text, ok, "fuzz#$runs")
            parsed++
        } catch (e: PockException) {
            // the expected failure
        } catch (e: Throwable) {
            if (firstBad == null) firstBad = "${e.javaClass.name} ${e.message} on: $text"
        }
    }
    report("fuzz_runs", runs)
    report("fuzz_parsed", parsed)
    report("fuzz_first_bad", firstBad ?: "none")
    report("done", true)
}
