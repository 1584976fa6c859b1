package ai.pockengine.android

import ai.onnxruntime.OnnxTensor
import ai.onnxruntime.OrtEnvironment
import ai.onnxruntime.OrtSession
import ai.pockengine.PockDType
import ai.pockengine.PockException
import ai.pockengine.PockStatus
import ai.pockengine.PockTensor
import ai.pockengine.PrefixRunner
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * Runs a bundle's frozen prefix (`pock-build --platform android --backends htp,cpu`) on the
 * Hexagon NPU with ONNX Runtime's Java API and its QNN execution provider, before each step:
 *
 *     val trainer = PockAssets.openTrainer(context, "keyboard", PockOptions(prefixRunner = QnnPrefixRunner()))
 *
 * The bundle's manifest "prefix" names the QNN context binary compiled on the build host for the
 * SoC (prefix/prefix_ctx.onnx, which points at prefix_ctx_qnn.bin) and the plain ONNX model as a
 * fallback (`fallbackToCpu`: the same prefix on ONNX Runtime's CPU provider where there is no HTP).
 * The result is the compiled step's inputs: the model inputs it keeps ("kept_inputs"), then the
 * prefix outputs, in manifest order.  Needs `com.microsoft.onnxruntime:onnxruntime-android-qnn`
 * (the AAR's POM declares it when the bundle has an HTP prefix).
 *
 * Not compiled on the project's Linux CI (no Android SDK / ONNX Runtime Android AAR there); the
 * same split is run and tested on the host by the Python trainer (backends/htp.py).
 */
class QnnPrefixRunner(private val fallbackToCpu: Boolean = true) : PrefixRunner, AutoCloseable {
    private val env: OrtEnvironment = OrtEnvironment.getEnvironment()
    private var session: OrtSession? = null

    @Suppress("UNCHECKED_CAST")
    override fun run(prefix: Map<String, Any?>, bundleDir: File, inputs: List<PockTensor>): List<PockTensor> {
        val s = session ?: open(prefix, bundleDir).also { session = it }
        val inputSpecs = prefix["inputs"] as List<Map<String, Any?>>
        val outputSpecs = prefix["outputs"] as List<Map<String, Any?>>
        val inputIndex = (prefix["input_index"] as List<Number>).map { it.toInt() }
        val kept = (prefix["kept_inputs"] as List<Number>).map { it.toInt() }
        val feeds = LinkedHashMap<String, OnnxTensor>()
        try {
            inputIndex.forEachIndexed { k, i ->
                feeds[inputSpecs[k]["name"] as String] = toOnnx(inputs[i], inputSpecs[k])
            }
            s.run(feeds).use { result ->
                val outs = outputSpecs.map { spec ->
                    val value = result.get(spec["name"] as String).orElseThrow {
                        PockException(PockStatus.BACKEND, "the HTP prefix produced no output '${spec["name"]}'")
                    } as OnnxTensor
                    val shape = (spec["shape"] as List<Number>).map { it.toInt() }.toIntArray()
                    val floats = FloatArray(shape.fold(1) { a, d -> a * d })
                    value.floatBuffer.get(floats)
                    PockTensor.of(floats, *shape)
                }
                return kept.map { inputs[it] } + outs
            }
        } catch (e: ai.onnxruntime.OrtException) {
            throw PockException(PockStatus.BACKEND, "the HTP prefix failed: ${e.message}", e)
        } finally {
            feeds.values.forEach { it.close() }
        }
    }

    private fun open(prefix: Map<String, Any?>, bundleDir: File): OrtSession {
        @Suppress("UNCHECKED_CAST")
        val files = prefix["files"] as Map<String, Any?>
        val context = File(bundleDir, files["context"] as String)
        val onnx = File(bundleDir, files["onnx"] as String)
        return try {
            val options = OrtSession.SessionOptions()
            options.addQnn(mapOf("backend_path" to "libQnnHtp.so", "htp_performance_mode" to "burst",
                "enable_htp_fp16_precision" to if (prefix["precision"] == "fp16") "1" else "0"))
            options.addConfigEntry("session.disable_cpu_ep_fallback", "1")
            env.createSession(context.path, options)
        } catch (e: ai.onnxruntime.OrtException) {
            if (!fallbackToCpu) {
                throw PockException(PockStatus.BACKEND, "cannot open the HTP prefix ${context.name} " +
                    "(built for ${prefix["soc"]}, HTP v${prefix["htp_arch"]}): ${e.message}", e)
            }
            env.createSession(onnx.path, OrtSession.SessionOptions())
        }
    }

    private fun toOnnx(t: PockTensor, spec: Map<String, Any?>): OnnxTensor {
        val shape = t.shape.map { it.toLong() }.toLongArray()
        return when (spec["dtype"]) {
            "f32" -> OnnxTensor.createTensor(env, java.nio.FloatBuffer.wrap(t.toFloatArray()), shape)
            "i64", "i32" -> {
                val longs = if (t.dtype == PockDType.INT64) t.toLongArray() else ints(t).map { it.toLong() }.toLongArray()
                if (spec["dtype"] == "i64") OnnxTensor.createTensor(env, java.nio.LongBuffer.wrap(longs), shape)
                else OnnxTensor.createTensor(env, ByteBuffer.allocateDirect(longs.size * 4).order(ByteOrder.nativeOrder())
                    .also { b -> longs.forEach { b.putInt(it.toInt()) }; b.flip() }.asIntBuffer(), shape)
            }
            else -> throw PockException(PockStatus.DTYPE, "the HTP prefix takes ${spec["dtype"]}, which this runner cannot pass")
        }
    }

    private fun ints(t: PockTensor): IntArray = when (val d = t.data) {
        is IntArray -> d
        is ByteBuffer -> IntArray(t.numel.toInt()).also { d.duplicate().order(ByteOrder.nativeOrder()).asIntBuffer().get(it) }
        else -> throw PockException(PockStatus.DTYPE, "the HTP prefix takes integer ids, got $t")
    }

    override fun close() {
        session?.close()
        session = null
    }
}
