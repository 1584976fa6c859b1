// Every Kotlin SDK call on the JVM, driven by test_sdk.py: a small MLP with float
// inputs (so a batch can hold NaN), a partial update (0.weight: half its input
// channels; 2.*: whole; 0.bias frozen) and SGD with momentum, over a host build
// of its library with pock_jni.cpp.
//
//   java -cp core:android:stubs:this:stdlib:coroutines SdkJvmTestKt BUNDLE LIBRARY BATCHES WORK PY_TRAINED SERVER
//
// BATCHES: N batches, each x (f32 [4, 8]) then y (i64 [4]), native order; batch 2's x holds a NaN.
// PY_TRAINED: a trained-only checkpoint Python wrote after 3 steps on batch 0.
// SERVER: the loopback federated server (test_sdk.py), http://127.0.0.1:PORT.
// Prints one "key value" line per fact; exits 1 on an unexpected exception.
import ai.pockengine.PockDType
import ai.pockengine.PockException
import ai.pockengine.PockFederated
import ai.pockengine.PockOptions
import ai.pockengine.PockProgress
import ai.pockengine.PockStepStatus
import ai.pockengine.PockTensor
import ai.pockengine.PockTrainer
import ai.pockengine.StateTensorSpec
import ai.pockengine.android.PockTrainingWorker
import android.content.Context
import android.content.pm.PackageInfo
import android.content.pm.PackageManager
import android.content.res.AssetManager
import androidx.work.WorkerParameters
import java.io.ByteArrayOutputStream
import java.io.DataInputStream
import java.io.File
import java.net.HttpURLConnection
import java.net.URL
import java.nio.ByteBuffer
import java.nio.ByteOrder
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking

typealias Batch = Pair<List<PockTensor>, List<PockTensor>>

fun report(key: String, value: Any?) = println("$key ${value.toString().replace('\n', ' ')}")

fun expectPockException(what: String, block: () -> Unit) {
    try {
        block()
    } catch (e: PockException) {
        report("error.$what", "${e.status} ${e.message}")
        return
    }
    throw AssertionError("$what: no PockException")
}

fun readBatches(file: File): List<Batch> {
    val bytes = ByteBuffer.wrap(file.readBytes()).order(ByteOrder.nativeOrder())
    val out = ArrayList<Batch>()
    while (bytes.remaining() > 0) {
        val x = FloatArray(4 * 8).also { bytes.asFloatBuffer().get(it); bytes.position(bytes.position() + it.size * 4) }
        val y = LongArray(4).also { bytes.asLongBuffer().get(it); bytes.position(bytes.position() + it.size * 8) }
        out.add(listOf(PockTensor.of(x, 4, 8)) to listOf(PockTensor.of(y, 4)))
    }
    return out
}

/** Every trained tensor, buffer and optimizer-state tensor of [t], as raw bytes. */
fun trainedState(t: PockTrainer): Map<String, List<Byte>> =
    t.stateTensors.filter { it.kind != StateTensorSpec.Kind.CONSTANT && it.name != "0.bias" }
        .associate { it.name to t.getTensor(it.name).toByteArray().toList() }

// ------------------------------------------------------------------ the worker on the android stubs
class DirContext(private val assetsDir: File, private val noBackup: File) : Context() {
    override fun getAssets() = AssetManager(assetsDir)
    override fun getNoBackupFilesDir() = noBackup
    override fun getPackageName() = "ai.pockengine.test"
    override fun getPackageManager(): PackageManager = object : PackageManager() {
        override fun getPackageInfo(packageName: String, flags: Int) = PackageInfo().also { it.lastUpdateTime = 1L }
    }
}

class MlpWorker(
    context: Context,
    private val library: File,
    private val data: List<Batch>,
    private val stopAt: Int = -1,
) : PockTrainingWorker(context, WorkerParameters()) {
    override val model = "sdkmlp"
    override val options get() = PockOptions(libraryFile = library)
    override val checkpointEvery get() = 2
    override fun batches() = sequence {
        for ((i, b) in data.withIndex()) {
            if (i == stopAt) stop() // the OS ends the work before batch stopAt
            yield(b)
        }
    }
}

// ------------------------------------------------------------------ the federated client over loopback
/** One framed message: a JSON line, then the .npy blobs whose lengths it lists. */
fun frame(json: String, blobs: List<ByteArray>): ByteArray {
    val out = ByteArrayOutputStream()
    out.write((json + "\n").toByteArray())
    blobs.forEach { out.write(it) }
    return out.toByteArray()
}

fun http(url: String, body: ByteArray?): ByteArray {
    val c = URL(url).openConnection() as HttpURLConnection
    if (body != null) {
        c.requestMethod = "POST"
        c.doOutput = true
        c.outputStream.use { it.write(body) }
    }
    if (c.responseCode != 200) throw AssertionError("$url: HTTP ${c.responseCode}")
    return c.inputStream.use { it.readBytes() }
}

fun main(args: Array<String>) {
    val (bundle, library, batchFile, work, pyTrained) = args.take(5).map(::File)
    val server = args[5]
    val options = PockOptions(libraryFile = library, numThreads = 1)
    val data = readBatches(batchFile)
    val good = data.filterIndexed { i, _ -> i != 2 }
    val (x, y) = data[0]

    PockTrainer.open(bundle, options).use { t ->
        // -------------------------------------------------------------- the vocabulary
        report("state_tensors", t.stateTensors.joinToString(";"))
        val out = t.forward(x[0])
        report("forward", out)
        val direct = ByteBuffer.allocateDirect(4 * 4 * 4).order(ByteOrder.nativeOrder())
        t.forward(x, listOf(PockTensor.of(direct, PockDType.FLOAT32, 4, 4)))
        report("forward_into_equal", PockTensor.of(direct, PockDType.FLOAT32, 4, 4).toFloatArray().contentEquals(out.toFloatArray()))
        val w = t.getTensor("2.weight")
        report("get_tensor", w)
        t.setTensor("2.weight", PockTensor.of(w.toFloatArray().map { it + 1f }.toFloatArray(), *w.shape))
        report("set_get_equal", t.getTensor("2.weight").toFloatArray().contentEquals(w.toFloatArray().map { it + 1f }.toFloatArray()))
        t.setTensor("2.weight", w)
        expectPockException("set_wrong_shape") { t.setTensor("2.weight", PockTensor.of(FloatArray(3), 3)) }
        expectPockException("unknown_tensor") { t.getTensor("nope.weight") }
        t.setLearningRate(0.05f)
        report("learning_rate", t.learningRate)
        t.setNumThreads(2)

        // -------------------------------------------------------------- a bad batch is skipped, not thrown
        val before = trainedState(t)
        val steps0 = t.stepCount
        val nanLoss = t.step(data[2].first, data[2].second)
        report("skip_loss_finite", nanLoss.isFinite())
        report("skip_status", t.lastStepStatus)
        report("skip_message", t.lastStepMessage)
        report("skipped_steps", t.skippedSteps)
        report("skip_state_kept", trainedState(t) == before && t.stepCount == steps0)
        t.step(x, y)
        report("after_good_status", t.lastStepStatus)
        PockTrainer.open(bundle, options.copy(strict = true)).use { strict ->
            expectPockException("strict") { strict.step(data[2].first, data[2].second) }
            report("strict_skipped_steps", strict.skippedSteps)
        }

        // -------------------------------------------------------------- train(): progress, cancellation
        val seen = ArrayList<PockProgress>()
        val result = runBlocking { t.train(data) { seen.add(it) } }
        report("progress", seen.joinToString(" ") { "${it.step}:${it.status}:${it.skippedSteps}" })
        report("train_result", "${result.steps} ${result.skipped} ${result.lastLoss.isFinite()}")
        val stepsBefore = t.stepCount
        lateinit var job: Job
        runBlocking {
            job = launch(Dispatchers.Default, start = CoroutineStart.LAZY) {
                t.train(generateSequence { data[0] }.take(1000)) { p -> if (p.step == 5) job.cancel() }
            }
            job.start()
            job.join()
        }
        report("cancel", "${job.isCancelled} ${t.stepCount - stepsBefore}")

        // -------------------------------------------------------------- profile
        val profile = t.profile(x, y, steps = 3, warmup = 1)
        report("profile_nodes", profile.nodes.size)
        report("profile_kernels", profile.byKernel().joinToString(",") { it.first })
        report("profile_sane", profile.nodes.sumOf { it.ms } > 0 && profile.stepMs > 0 && profile.losses.size == 3)
        report("profile_phases", profile.nodes.map { it.phase }.toSet().sorted().joinToString(","))

        // -------------------------------------------------------------- trained-only checkpoints
        val full = File(work, "kt_full.pockckpt")
        val lite = File(work, "kt_trained.pockckpt")
        t.save(full)
        t.save(lite, trainedOnly = true)
        report("sizes", "${full.length()} ${lite.length()}")
        PockTrainer.open(bundle, options).use { fresh ->
            fresh.load(lite)
            report("trained_only_equal", trainedState(fresh) == trainedState(t) && fresh.stepCount == t.stepCount)
            report("trained_only_next_loss_equal", fresh.step(x, y) == t.step(x, y))
        }
        PockTrainer.open(bundle, options).use { fresh ->
            fresh.load(pyTrained) // written by Python's save(trained_only=True)
            report("py_trained_step_count", fresh.stepCount)
            fresh.save(File(work, "kt_after_py.pockckpt"))
            val b = fresh.getTensor("0.bias")
            fresh.setTensor("0.bias", PockTensor.of(b.toFloatArray().map { it + 1f }.toFloatArray(), *b.shape))
            val kept = trainedState(fresh)
            expectPockException("other_base") { fresh.load(lite) }
            report("other_base_state_kept", trainedState(fresh) == kept)
        }
    }

    // ------------------------------------------------------------------ the worker: skips, checkpoints, resumes
    val ctx = DirContext(File(work, "assets"), File(work, "nobackup"))
    val run1 = MlpWorker(ctx, library, data, stopAt = 3).doWork()
    val progress = File(work, "nobackup/pockengine/sdkmlp.pockckpt.progress")
    report("worker_run1", "$run1 ${progress.readText()}")
    val run2 = MlpWorker(ctx, library, data).doWork()
    val o = run2.outputData
    report("worker_run2", "$run2 ${o.getInt(PockTrainingWorker.KEY_STEPS, -1)} ${o.getInt(PockTrainingWorker.KEY_SKIPPED, -1)} " +
        "${o.getLong(PockTrainingWorker.KEY_BATCHES, -1)} ${progress.exists()}")
    PockTrainer.open(bundle, options).use { reference ->
        for ((bx, by) in data) reference.step(bx, by) // uninterrupted, the NaN batch skipped
        PockTrainer.open(bundle, options).use { resumed ->
            resumed.load(File(work, "nobackup/pockengine/sdkmlp.pockckpt"))
            report("worker_equal_uninterrupted", trainedState(resumed) == trainedState(reference) &&
                resumed.stepCount == reference.stepCount)
            report("worker_step_count", resumed.stepCount)
        }
    }
    // a hard error (a wrong shape) after two good batches: failure, the two steps kept
    val broken = good.take(2) + listOf(listOf(PockTensor.of(FloatArray(3), 3)) to data[0].second)
    val run3 = MlpWorker(ctx, library, broken).doWork()
    report("worker_run3", "$run3 ${run3.outputData.getString(PockTrainingWorker.KEY_ERROR)?.take(60)}")
    PockTrainer.open(bundle, options).use { after ->
        after.load(File(work, "nobackup/pockengine/sdkmlp.pockckpt"))
        report("worker_run3_step_count", after.stepCount)
    }

    // ------------------------------------------------------------------ a federated round over loopback
    PockTrainer.open(bundle, options).use { t ->
        val ins = DataInputStream(http("$server/fit", null).inputStream())
        val head = ins.readLine()
        val scheme = Regex("\"scheme\": (\\[.*?\\]\\])").find(head)!!.groupValues[1]
        val lengths = Regex("\"lengths\": \\[([0-9, ]*)\\]").find(head)!!.groupValues[1].split(",").map { it.trim().toInt() }
        val elements = PockFederated.decodeScheme(scheme)
        val globals = lengths.map { n -> PockFederated.Npy.decode(ByteArray(n).also { ins.readFully(it) }) }
        val fit = PockFederated.fit(t, File(bundle, "weights.pockckpt"), elements, globals, data, numExamples = 4 * data.size)
        val blobs = fit.arrays.map { PockFederated.Npy.encode(it) }
        val json = "{\"num_examples\": ${fit.numExamples}, \"loss\": ${fit.loss}, \"skipped\": ${fit.skipped}, " +
            "\"scheme\": ${jsonString(scheme)}, \"lengths\": [${blobs.joinToString(", ") { it.size.toString() }}]}"
        val reply = String(http("$server/fit", frame(json, blobs)))
        report("fed_elements", elements.joinToString(";") { "${it.name}:${it.k}" })
        report("fed_upload_bytes", blobs.sumOf { it.size })
        report("fed_reply", reply)
        report("fed_skipped", fit.skipped)
    }
    report("done", true)
}

fun jsonString(s: String) = "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""
