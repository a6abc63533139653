package org.edgevit.demo.core

import org.junit.Assert.assertEquals
import org.junit.Assert.fail
import org.junit.Test

class JsonTest {
    @Test
    fun parsesEveryKindOfValue() {
        val v = Json.parse(""" {"a": [1, -2.5e-3, true, false, null], "b": {"c": "x\"\\\/\n\u00e9"}, "d": {}} """)
        assertEquals(
            mapOf("a" to listOf(1.0, -2.5e-3, true, false, null), "b" to mapOf("c" to "x\"\\/\n\u00e9"), "d" to emptyMap<String, Any?>()),
            v,
        )
        assertEquals(0.003921568859368563, Json.parse("0.003921568859368563"))
        assertEquals(emptyList<Any?>(), Json.parse("[ ]"))
    }

    @Test
    fun rejectsMalformedInput() {
        for (bad in listOf("", "{", "[1,]x", "{\"a\" 1}", "\"abc", "tru", "01x", "{\"a\":1,}", "-", "[1 2]")) {
            try {
                Json.parse(bad)
                fail("accepted '$bad'")
            } catch (e: JsonException) {
                // expected
            }
        }
    }
}
