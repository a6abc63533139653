package org.edgevit.demo.core

/**
 * A small, strict JSON reader (RFC 8259) for the model metadata.
 *
 * Objects become [Map] (insertion order kept), arrays [List], numbers [Double],
 * and `true`/`false`/`null` their Kotlin values. Written here rather than using
 * `org.json` so the metadata code is plain Kotlin: it runs unchanged in JVM
 * unit tests, where Android's `org.json` is only a stub.
 */
object Json {
    fun parse(text: String): Any? {
        val reader = Reader(text)
        reader.skipWhitespace()
        val value = reader.readValue()
        reader.skipWhitespace()
        if (!reader.atEnd()) reader.fail("unexpected text after the JSON value")
        return value
    }

    private class Reader(private val s: String) {
        private var i = 0

        fun atEnd() = i >= s.length

        fun fail(message: String): Nothing {
            throw JsonException("$message at offset $i")
        }

        fun skipWhitespace() {
            while (i < s.length && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++
        }

        fun readValue(): Any? {
            if (atEnd()) fail("unexpected end of input")
            return when (val c = s[i]) {
                '{' -> readObject()
                '[' -> readArray()
                '"' -> readString()
                't' -> readLiteral("true", true)
                'f' -> readLiteral("false", false)
                'n' -> readLiteral("null", null)
                else -> if (c == '-' || c in '0'..'9') readNumber() else fail("unexpected character '$c'")
            }
        }

        private fun readLiteral(word: String, value: Any?): Any? {
            if (!s.startsWith(word, i)) fail("expected '$word'")
            i += word.length
            return value
        }

        private fun readObject(): Map<String, Any?> {
            val result = LinkedHashMap<String, Any?>()
            i++ // {
            skipWhitespace()
            if (i < s.length && s[i] == '}') { i++; return result }
            while (true) {
                skipWhitespace()
                if (atEnd() || s[i] != '"') fail("expected a string key")
                val key = readString()
                skipWhitespace()
                if (atEnd() || s[i] != ':') fail("expected ':'")
                i++
                skipWhitespace()
                result[key] = readValue()
                skipWhitespace()
                if (atEnd()) fail("unterminated object")
                when (s[i]) {
                    ',' -> i++
                    '}' -> { i++; return result }
                    else -> fail("expected ',' or '}'")
                }
            }
        }

        private fun readArray(): List<Any?> {
            val result = ArrayList<Any?>()
            i++ // [
            skipWhitespace()
            if (i < s.length && s[i] == ']') { i++; return result }
            while (true) {
                skipWhitespace()
                result.add(readValue())
                skipWhitespace()
                if (atEnd()) fail("unterminated array")
                when (s[i]) {
                    ',' -> i++
                    ']' -> { i++; return result }
                    else -> fail("expected ',' or ']'")
                }
            }
        }

        private fun readString(): String {
            i++ // opening quote
            val out = StringBuilder()
            while (true) {
                if (atEnd()) fail("unterminated string")
                val c = s[i++]
                when {
                    c == '"' -> return out.toString()
                    c == '\\' -> {
                        if (atEnd()) fail("unterminated escape")
                        when (val e = s[i++]) {
                            '"' -> out.append('"')
                            '\\' -> out.append('\\')
                            '/' -> out.append('/')
                            'b' -> out.append('\b')
                            'f' -> out.append('\u000C')
                            'n' -> out.append('\n')
                            'r' -> out.append('\r')
                            't' -> out.append('\t')
                            'u' -> {
                                if (i + 4 > s.length) fail("bad \\u escape")
                                val code = s.substring(i, i + 4).toIntOrNull(16) ?: fail("bad \\u escape")
                                out.append(code.toChar())
                                i += 4
                            }
                            else -> fail("bad escape '\\$e'")
                        }
                    }
                    c < ' ' -> fail("control character in string")
                    else -> out.append(c)
                }
            }
        }

        private fun readNumber(): Double {
            val start = i
            if (s[i] == '-') i++
            if (atEnd() || s[i] !in '0'..'9') fail("bad number")
            while (i < s.length && (s[i] in '0'..'9' || s[i] in ".eE+-")) i++
            return s.substring(start, i).toDoubleOrNull() ?: fail("bad number '${s.substring(start, i)}'")
        }
    }
}

class JsonException(message: String) : IllegalArgumentException(message)
