package ai.pockengine

/**
 * A minimal JSON reader for the model bundle's `model.json`, so the core API
 * needs nothing beyond the Kotlin standard library (no org.json, which is an
 * `android.*`-era dependency on the JVM).
 *
 * Values map to Kotlin as: object -> Map<String, Any?> (insertion order),
 * array -> List<Any?>, string -> String, number -> Long when integral else
 * Double, true/false -> Boolean, null -> null.
 *
 * Bounded: nesting deeper than [MAX_DEPTH] objects/arrays, a duplicate key, a
 * number that is not JSON or an integer beyond Long are a [PockException]
 * (never a StackOverflowError or a silently wrapped value).
 */
internal class MiniJson private constructor(private val text: String, private val where: String) {
    private var pos = 0
    private var depth = 0

    companion object {
        /** The deepest nesting of objects and arrays a manifest may use. */
        const val MAX_DEPTH = 64

        /** Parse [text]; a syntax error is a [PockException] naming [where] and the offset. */
        fun parse(text: String, where: String): Any? {
            val p = MiniJson(text, where)
            p.skipSpace()
            val value = p.value()
            p.skipSpace()
            if (p.pos != text.length) p.fail("unexpected '${text[p.pos]}' after the value")
            return value
        }
    }

    private fun fail(why: String): Nothing =
        throw PockException(PockStatus.INVALID_ARGUMENT, "$where: corrupt JSON at offset $pos: $why")

    private fun skipSpace() {
        while (pos < text.length && text[pos].isWhitespace()) pos++
    }

    private fun expect(c: Char) {
        skipSpace()
        if (pos >= text.length || text[pos] != c) fail("expected '$c'")
        pos++
    }

    private fun value(): Any? {
        skipSpace()
        if (pos >= text.length) fail("unexpected end of input")
        return when (val c = text[pos]) {
            '{' -> obj()
            '[' -> array()
            '"' -> string()
            't' -> literal("true", true)
            'f' -> literal("false", false)
            'n' -> literal("null", null)
            else -> if (c == '-' || c.isDigit()) number() else fail("unexpected '$c'")
        }
    }

    private fun literal(word: String, value: Any?): Any? {
        if (!text.startsWith(word, pos)) fail("expected '$word'")
        pos += word.length
        return value
    }

    private fun enter() {
        if (++depth > MAX_DEPTH) fail("nesting deeper than $MAX_DEPTH")
    }

    private fun obj(): Map<String, Any?> {
        enter()
        pos++ // '{'
        val out = LinkedHashMap<String, Any?>()
        skipSpace()
        if (pos < text.length && text[pos] == '}') return out.also { pos++; depth-- }
        while (true) {
            skipSpace()
            if (pos >= text.length || text[pos] != '"') fail("expected a string key")
            val key = string()
            if (out.containsKey(key)) fail("duplicate key '$key'")
            expect(':')
            out[key] = value()
            skipSpace()
            if (pos < text.length && text[pos] == ',') { pos++; continue }
            expect('}')
            depth--
            return out
        }
    }

    private fun array(): List<Any?> {
        enter()
        pos++ // '['
        val out = ArrayList<Any?>()
        skipSpace()
        if (pos < text.length && text[pos] == ']') return out.also { pos++; depth-- }
        while (true) {
            out.add(value())
            skipSpace()
            if (pos < text.length && text[pos] == ',') { pos++; continue }
            expect(']')
            depth--
            return out
        }
    }

    private fun string(): String {
        pos++ // opening quote
        val sb = StringBuilder()
        while (true) {
            if (pos >= text.length) fail("unterminated string")
            val c = text[pos++]
            when (c) {
                '"' -> return sb.toString()
                '\\' -> {
                    if (pos >= text.length) fail("unterminated escape")
                    when (val e = text[pos++]) {
                        '"', '\\', '/' -> sb.append(e)
                        'b' -> sb.append('\b')
                        'f' -> sb.append('\u000C')
                        'n' -> sb.append('\n')
                        'r' -> sb.append('\r')
                        't' -> sb.append('\t')
                        'u' -> {
                            if (pos + 4 > text.length) fail("short \\u escape")
                            sb.append(text.substring(pos, pos + 4).toIntOrNull(16)?.toChar() ?: fail("bad \\u escape"))
                            pos += 4
                        }
                        else -> fail("bad escape '\\$e'")
                    }
                }
                else -> sb.append(c)
            }
        }
    }

    private fun number(): Any {
        val start = pos
        if (text[pos] == '-') pos++
        while (pos < text.length && (text[pos] in '0'..'9' || text[pos] in ".eE+-")) pos++
        val s = text.substring(start, pos)
        if (!NUMBER.matches(s)) fail("bad number '${s.take(40)}'")
        if (s.none { it in ".eE" }) return s.toLongOrNull() ?: fail("integer '${s.take(40)}' does not fit 64 bits")
        return s.toDoubleOrNull()?.takeIf { it.isFinite() } ?: fail("bad number '${s.take(40)}'")
    }

    private val NUMBER = Regex("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?")
}
