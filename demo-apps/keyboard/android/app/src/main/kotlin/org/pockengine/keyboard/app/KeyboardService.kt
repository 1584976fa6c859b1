package org.pockengine.keyboard.app

import android.inputmethodservice.InputMethodService
import android.os.Handler
import android.os.Looper
import android.text.InputType
import android.view.Gravity
import android.view.View
import android.view.inputmethod.EditorInfo
import android.widget.Button
import android.widget.LinearLayout
import android.widget.TextView
import java.util.concurrent.Executors

/** A minimal QWERTY keyboard with two three-word suggestion strips: smart compose (the
 *  personalized LLM, SmartCompose, computed off the main thread) above the LSTM model's
 *  next words. Finished sentences go to the on-device training buffer, except from password
 *  fields or fields that ask for no personalized learning. */
class KeyboardService : InputMethodService() {
    private val app get() = application as KeyboardApp
    private lateinit var strip: List<TextView>
    private lateinit var composeStrip: List<TextView>
    private val composer = Executors.newSingleThreadExecutor()
    private val main = Handler(Looper.getMainLooper())
    @Volatile private var composeFor = ""
    private var learn = true

    override fun onStartInput(info: EditorInfo, restarting: Boolean) {
        super.onStartInput(info, restarting)
        val variation = info.inputType and InputType.TYPE_MASK_VARIATION
        learn = (info.imeOptions and EditorInfo.IME_FLAG_NO_PERSONALIZED_LEARNING) == 0 &&
            variation != InputType.TYPE_TEXT_VARIATION_PASSWORD &&
            variation != InputType.TYPE_TEXT_VARIATION_VISIBLE_PASSWORD &&
            variation != InputType.TYPE_TEXT_VARIATION_WEB_PASSWORD
    }

    override fun onCreateInputView(): View = LinearLayout(this).apply {
        orientation = LinearLayout.VERTICAL
        composeStrip = suggestionRow(this)
        strip = suggestionRow(this)
        for (keys in listOf("qwertyuiop", "asdfghjkl'", "zxcvbnm,.?")) {
            val line = LinearLayout(context)
            keys.forEach { c -> line.addView(key(c.toString()) { type(c.toString()) }, weight()) }
            addView(line)
        }
        val last = LinearLayout(context)
        last.addView(key("⌫") { currentInputConnection?.deleteSurroundingText(1, 0); refresh() }, weight())
        last.addView(key("space") { type(" ") }, LinearLayout.LayoutParams(0, LinearLayout.LayoutParams.WRAP_CONTENT, 4f))
        last.addView(key("⏎") { endSentence(); type("\n") }, weight())
        addView(last)
    }

    private fun suggestionRow(parent: LinearLayout): List<TextView> {
        val row = LinearLayout(parent.context)
        val views = List(3) {
            TextView(parent.context).apply {
                gravity = Gravity.CENTER
                textSize = 18f
                setPadding(8, 16, 8, 16)
                setOnClickListener { pick(text.toString()) }
                row.addView(this, LinearLayout.LayoutParams(0, LinearLayout.LayoutParams.WRAP_CONTENT, 1f))
            }
        }
        parent.addView(row)
        return views
    }

    private fun key(label: String, onClick: () -> Unit) = Button(this).apply {
        text = label
        isAllCaps = false
        setOnClickListener { onClick() }
    }

    private fun weight() = LinearLayout.LayoutParams(0, LinearLayout.LayoutParams.WRAP_CONTENT, 1f)

    private fun type(s: String) {
        currentInputConnection?.commitText(s, 1)
        if (s in setOf(".", "?")) endSentence()
        refresh()
    }

    /** Replaces the word being typed with the suggestion and adds a space. */
    private fun pick(word: String) {
        if (word.isEmpty()) return
        val ic = currentInputConnection ?: return
        val before = ic.getTextBeforeCursor(64, 0)?.toString().orEmpty()
        val partial = Regex("[A-Za-z'’]+$").find(before)?.value.orEmpty()
        ic.deleteSurroundingText(partial.length, 0)
        ic.commitText("$word ", 1)
        refresh()
    }

    private fun refresh() {
        val before = currentInputConnection?.getTextBeforeCursor(200, 0)?.toString().orEmpty()
        val line = before.substringAfterLast('\n')
        val words = runCatching { app.ranker.suggest(line) }.getOrDefault(emptyList())
        strip.forEachIndexed { i, v -> v.text = words.getOrElse(i) { "" } }
        // smart compose: generation takes longer than a key press, so off the main thread, newest text only
        composeFor = line
        composer.execute {
            if (composeFor != line) return@execute
            val more = runCatching { app.smartCompose?.suggest(line) }.getOrNull().orEmpty()
            main.post { if (composeFor == line) composeStrip.forEachIndexed { i, v -> v.text = more.getOrElse(i) { "" } } }
        }
    }

    override fun onDestroy() {
        composer.shutdownNow()
        super.onDestroy()
    }

    /** The sentence just finished goes to the training buffer (on this phone only). */
    private fun endSentence() {
        if (!learn) return
        val before = currentInputConnection?.getTextBeforeCursor(500, 0)?.toString().orEmpty()
        val sentence = before.split(Regex("(?<=[.!?])\\s+|\\n")).lastOrNull { it.isNotBlank() } ?: return
        app.buffer.add(sentence)
        TrainWorker.schedule(this)
    }
}
