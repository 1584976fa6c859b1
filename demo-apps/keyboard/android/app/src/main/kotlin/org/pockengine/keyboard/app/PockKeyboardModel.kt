package org.pockengine.keyboard.app

import ai.pockengine.PockTensor
import ai.pockengine.PockTrainer
import org.pockengine.keyboard.CompiledShape
import org.pockengine.keyboard.NextWordModel
import org.pockengine.keyboard.StepTrainer

/**
 * The shared logic's model and trainer over the SDK: [NextWordModel] with
 * `PockTrainer.forward` on the current (personalized) weights and [StepTrainer] with
 * `PockTrainer.step`, both at the compiled [shape] (batch x seq ids, int64). [trainer]
 * is asked on every call, so the app may close and reopen its trainer ("forget").
 * Plain Kotlin (no android.*): tests/demo/test_keyboard_app_jvm.py runs it on the JVM.
 */
class PockKeyboardModel(
    private val shape: CompiledShape,
    private val trainer: () -> PockTrainer,
) : NextWordModel, StepTrainer {
    override fun nextLogits(context: IntArray): FloatArray {
        val logits = trainer().forward(ids(shape.input(context))).toFloatArray()
        return shape.nextLogits(logits, context)
    }

    override fun step(x: IntArray, y: IntArray): Float = trainer().step(ids(x), ids(y))

    private fun ids(values: IntArray): PockTensor =
        PockTensor.of(LongArray(values.size) { values[it].toLong() }, shape.batch, shape.seq)
}
