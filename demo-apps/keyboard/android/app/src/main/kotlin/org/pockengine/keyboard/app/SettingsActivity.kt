package org.pockengine.keyboard.app

import android.app.Activity
import android.os.Bundle
import android.provider.Settings
import android.content.Intent
import android.widget.Button
import android.widget.LinearLayout
import android.widget.TextView
import java.text.DateFormat
import java.util.Date

/** How much the keyboard has learned, and the switch to forget it. */
class SettingsActivity : Activity() {
    private lateinit var info: TextView

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        val app = application as KeyboardApp
        info = TextView(this).apply { textSize = 16f; setPadding(32, 32, 32, 32) }
        setContentView(LinearLayout(this).apply {
            orientation = LinearLayout.VERTICAL
            addView(info)
            addView(Button(this@SettingsActivity).apply {
                text = "Enable the keyboard"
                setOnClickListener { startActivity(Intent(Settings.ACTION_INPUT_METHOD_SETTINGS)) }
            })
            addView(Button(this@SettingsActivity).apply {
                text = "Forget what I typed"
                setOnClickListener { app.forget(); show() }
            })
            addView(Button(this@SettingsActivity).apply {
                text = "Export smart-compose adapter (PEFT)"
                isEnabled = app.smartCompose != null
                setOnClickListener {
                    // adapter_model.safetensors + adapter_config.json: peft.PeftModel.from_pretrained loads them
                    val dir = java.io.File(getExternalFilesDir(null), "smart_compose_adapter")
                    app.smartCompose?.exportAdapter(dir.path)
                    info.append("\n\nAdapter written to $dir")
                }
            })
        })
    }

    override fun onResume() {
        super.onResume()
        show()
    }

    private fun show() {
        val app = application as KeyboardApp
        val s = app.personalizer.stats
        val last = if (s.lastTrainedMillis == 0L) "never" else DateFormat.getDateTimeInstance().format(Date(s.lastTrainedMillis))
        info.text = "Learned on this phone only\n\n" +
            "Training steps: ${s.steps}\n" +
            "Last loss: ${if (s.lastLoss.isNaN()) "-" else "%.2f".format(s.lastLoss)}\n" +
            "Last personalized: $last\n" +
            "Sentences learned: ${s.sentencesLearned}\n" +
            "Sentences waiting: ${app.buffer.untrained} (trains while charging)"
    }
}
