// The Kotlin SDK on the JVM, driven by test_jvm.py: the keyboard model's bundle
// with a host build of its library (model TU + runtime + pock_jni.cpp).
//
//   java -cp core.jar:this.jar:kotlin-stdlib.jar:kotlinx-coroutines.jar KeyboardJvmTestKt BUNDLE_DIR LIBRARY BATCH WORK_DIR
//
// BATCH holds the input then the target token ids (int64, native order).  Prints
// one "key value..." line per fact for the Python side to assert on; exits 1 on
// an unexpected exception (a crash of the VM would give no "done" line).
import ai.pockengine.PockDType
import ai.pockengine.PockException
import ai.pockengine.PockOptions
import ai.pockengine.PockTensor
import ai.pockengine.PockTrainer
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.util.concurrent.CountDownLatch
import java.util.concurrent.Executors
import java.util.zip.ZipEntry
import java.util.zip.ZipOutputStream
import kotlin.coroutines.Continuation
import kotlin.coroutines.EmptyCoroutineContext
import kotlin.coroutines.startCoroutine

const val STEPS = 50

fun report(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

/** The PockException that [block] throws (anything else, or nothing, fails the test). */
fun expectPockException(what: String, block: () -> Unit) {
    try {
        block()
    } catch (e: PockException) {
        report("error.$what", "${e.status} ${e.message}")
        return
    }
    throw AssertionError("$what: no PockException")
}

/** Run a suspend block to completion on this thread's caller (no kotlinx.coroutines needed). */
fun <T> runSuspending(block: suspend () -> T): T {
    val done = CountDownLatch(1)
    var result: Result<T>? = null
    block.startCoroutine(Continuation(EmptyCoroutineContext) { result = it; done.countDown() })
    done.await()
    return result!!.getOrThrow()
}

fun main(args: Array<String>) {
    val (bundleDir, library, batchFile, work) = args.map(::File)
    val options = PockOptions(libraryFile = library, numThreads = 2)

    // The batch: the input as a direct ByteBuffer (read in place), the target as a LongArray.
    val bytes = batchFile.readBytes()
    val half = bytes.size / 2
    val direct = ByteBuffer.allocateDirect(half).order(ByteOrder.nativeOrder())
    direct.put(bytes, 0, half).flip()
    val targets = LongArray(half / 8)
    ByteBuffer.wrap(bytes, half, half).order(ByteOrder.nativeOrder()).asLongBuffer().get(targets)

    PockTrainer.open(bundleDir, options).use { trainer ->
        val (b, s) = trainer.inputs[0].shape.let { it[0] to it[1] }
        val x = PockTensor.of(direct, PockDType.INT64, b, s)
        val y = PockTensor.of(targets, b, s)
        report("model", trainer.modelName)
        report("inputs", trainer.inputs.joinToString())
        report("outputs", trainer.outputs.joinToString())
        report("learning_rate", trainer.learningRate)

        val losses = FloatArray(STEPS) { trainer.step(x, y) }
        report("losses", losses.joinToString(" "))
        report("step_count", trainer.stepCount)

        // int32 token ids are accepted where the model wants int64 (widened on the copy)
        val xInt = IntArray(b * s)
        direct.duplicate().order(ByteOrder.nativeOrder()).asLongBuffer().let { lb -> for (i in xInt.indices) xInt[i] = lb.get(i).toInt() }
        val predicted = trainer.forward(x).toFloatArray()
        val predictedInt = trainer.forward(PockTensor.of(xInt, b, s)).toFloatArray()
        report("predict_numel", predicted.size)
        report("predict_int32_equal", predicted.contentEquals(predictedInt))

        val ckpt = File(work, "user.pockckpt")
        trainer.save(ckpt)
        PockTrainer.open(bundleDir, options).use { fresh ->
            report("fresh_equal_before_restore", fresh.forward(x).toFloatArray().contentEquals(predicted))
            fresh.load(ckpt)
            report("restored_equal", fresh.forward(x).toFloatArray().contentEquals(predicted))
            report("restored_step_count", fresh.stepCount)
            report("restored_next_loss_equal", fresh.step(x, y) == trainer.step(x, y))
        }

        trainer.setLearningRate(0.5f)
        report("learning_rate_set", trainer.learningRate)
        expectPockException("negative_lr") { trainer.setLearningRate(-1f) }

        // wrong shapes and dtypes: caught against model.json, before the native call
        expectPockException("wrong_shape") { trainer.step(PockTensor.of(LongArray(b * (s - 1)), b, s - 1), y) }
        expectPockException("wrong_dtype") { trainer.step(PockTensor.of(FloatArray(b * s), b, s), y) }
        expectPockException("wrong_count") { trainer.step(listOf(x, x), listOf(y)) }
        expectPockException("array_too_short") { PockTensor.of(LongArray(3), b, s) }
        // a token id outside the vocabulary: the C API's own check
        val vocab = trainer.outputs[0].shape.last()
        expectPockException("token_out_of_range") { trainer.step(PockTensor.of(LongArray(b * s) { vocab.toLong() }, b, s), y) }

        // a corrupt checkpoint is rejected whole; the trainer keeps its state
        val corrupt = File(work, "corrupt.pockckpt")
        val raw = ckpt.readBytes()
        raw[raw.size / 2] = (raw[raw.size / 2].toInt() xor 0x5a).toByte()
        corrupt.writeBytes(raw)
        val before = trainer.forward(x).toFloatArray()
        expectPockException("corrupt_checkpoint") { trainer.load(corrupt) }
        expectPockException("missing_checkpoint") { trainer.load(File(work, "nowhere.pockckpt")) }
        report("state_kept_after_corrupt", trainer.forward(x).toFloatArray().contentEquals(before))

        // background training: an Executor future and a suspend call, serialised by the trainer's lock
        val pool = Executors.newFixedThreadPool(2)
        try {
            val futures = (0 until 4).map { trainer.stepAsync(pool, listOf(x), listOf(y)) }
            report("async_losses_finite", futures.all { it.get().isFinite() })
            val last = runSuspending { trainer.train(List(3) { listOf(x) to listOf(y) }).losses.last() }
            report("suspend_loss_finite", last.isFinite())
            report("async_step_count", trainer.stepCount)
            val failed = runCatching { runSuspending { trainer.train(listOf(listOf(PockTensor.of(LongArray(3), 3)) to listOf(y))) } }.exceptionOrNull()
            report("suspend_error", if (failed is PockException) "PockException ${failed.status}" else failed.toString())
        } finally {
            pool.shutdown()
        }
    }

    // use after close
    val closed = PockTrainer.open(bundleDir, options)
    closed.close()
    closed.close() // idempotent
    val xs = PockTensor.zeros(PockDType.INT64, 4, 16)
    expectPockException("closed_step") { closed.step(xs, xs) }
    expectPockException("closed_predict") { closed.forward(xs) }
    expectPockException("closed_save") { closed.save(File(work, "closed.pockckpt")) }
    report("closed", closed.isClosed)

    // a zipped bundle from an InputStream
    val zip = File(work, "bundle.zip")
    ZipOutputStream(zip.outputStream()).use { out ->
        for (f in bundleDir.listFiles()!!.filter { it.isFile }) {
            out.putNextEntry(ZipEntry("keyboard/${f.name}"))
            f.inputStream().use { it.copyTo(out) }
            out.closeEntry()
        }
    }
    zip.inputStream().use { stream ->
        PockTrainer.open(stream, File(work, "unzipped"), options).use { t ->
            report("stream_step_count", t.stepCount)
            report("stream_first_loss", t.step(PockTensor.of(direct, PockDType.INT64, 4, 16), PockTensor.of(targets, 4, 16)))
        }
    }
    expectPockException("not_a_bundle") { PockTrainer.open(work, options) }
    report("done", true)
}
