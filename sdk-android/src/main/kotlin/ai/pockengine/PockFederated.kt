package ai.pockengine

import java.io.ByteArrayOutputStream
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The device side of federated personalization (toolchain/pockengine/federated): a Flower
 * client's `fit` over a [PockTrainer].  The server sends the global values of the scheme's
 * trained elements; [fit] restores the base checkpoint (fresh optimizer state), writes them,
 * trains on the user's own batches and returns only those elements, which is all the phone
 * uploads (a partial update: only the first k input channels).
 *
 * Arrays travel as Flower's `ndarrays_to_parameters` does: one NumPy `.npy` blob per element
 * ([Npy]), so a transport can hand them to Flower's strategy unchanged.
 */
object PockFederated {
    /** A trained element: a whole parameter (k = null) or its first k input channels (dim 1). */
    data class Element(val name: String, val k: Int? = null)

    /** What fit uploads: one float array per element, the example count and the mean loss. */
    data class FitResult(val arrays: List<PockTensor>, val numExamples: Int, val loss: Float, val skipped: Int)

    /** The scheme as the Python side encodes it: `[["name", k or null], ...]`. */
    @JvmStatic
    fun decodeScheme(text: String): List<Element> {
        val parsed = MiniJson.parse(text, "federated scheme") as? List<*>
            ?: throw PockException(PockStatus.INVALID_ARGUMENT, "federated scheme is not a JSON list: ${text.take(80)}")
        return parsed.map { e ->
            val pair = e as? List<*>
            val name = pair?.getOrNull(0) as? String
                ?: throw PockException(PockStatus.INVALID_ARGUMENT, "federated scheme entry $e is not [name, k]")
            Element(name, (pair.getOrNull(1) as? Number)?.toInt())
        }
    }

    /** The current values of [elements] (a partial one sliced to [:, :k]). */
    @JvmStatic
    fun readElements(trainer: PockTrainer, elements: List<Element>): List<PockTensor> = elements.map { e ->
        val full = trainer.getTensor(e.name)
        if (e.k == null) full else slice(full, e)
    }

    /** Overwrite exactly [elements]; the frozen channels of a partial one keep their bits. */
    @JvmStatic
    fun writeElements(trainer: PockTrainer, elements: List<Element>, arrays: List<PockTensor>) {
        if (arrays.size != elements.size) {
            throw PockException(PockStatus.INVALID_ARGUMENT, "federated payload has ${arrays.size} arrays for ${elements.size} elements")
        }
        for ((e, a) in elements.zip(arrays)) {
            val full = trainer.getTensor(e.name)
            val want = sliceShape(full.shape, e)
            if (!a.shape.contentEquals(want) || a.dtype != PockDType.FLOAT32) {
                throw PockException(PockStatus.SHAPE, "federated payload for '${e.name}' is ${a}, expected f32${PockTensor.shapeString(want)}")
            }
            if (e.k == null) {
                trainer.setTensor(e.name, a)
                continue
            }
            val dst = full.toFloatArray()
            val src = a.toFloatArray()
            val (rows, cols, inner) = dims(full.shape)
            for (r in 0 until rows) System.arraycopy(src, r * e.k * inner, dst, r * cols * inner, e.k * inner)
            trainer.setTensor(e.name, PockTensor.of(dst, *full.shape))
        }
    }

    /**
     * Flower's `fit` on the device: restore [base] (the bundle's weights: fresh optimizer
     * state every round), write the global [parameters] of [elements], train on [batches]
     * (non-finite ones skipped and counted) and return the trained elements to upload.
     */
    @JvmStatic
    @JvmOverloads
    fun fit(
        trainer: PockTrainer,
        base: File,
        elements: List<Element>,
        parameters: List<PockTensor>,
        batches: Iterable<Pair<List<PockTensor>, List<PockTensor>>>,
        numExamples: Int,
        onProgress: ((PockProgress) -> Unit)? = null,
    ): FitResult {
        trainer.load(base)
        writeElements(trainer, elements, parameters)
        val losses = ArrayList<Float>()
        var skipped = 0
        for ((x, y) in batches) {
            val loss = trainer.step(x, y)
            if (trainer.lastStepStatus == PockStepStatus.OK) losses.add(loss) else skipped++
            onProgress?.invoke(PockProgress(losses.size + skipped, loss, trainer.lastStepStatus, trainer.skippedSteps))
        }
        val mean = if (losses.isEmpty()) 0f else losses.sum() / losses.size
        return FitResult(readElements(trainer, elements), numExamples, mean, skipped)
    }

    private fun dims(shape: IntArray): Triple<Int, Int, Int> {
        if (shape.size < 2) throw PockException(PockStatus.SHAPE, "a partial element needs >= 2 dims, got ${PockTensor.shapeString(shape)}")
        return Triple(shape[0], shape[1], shape.drop(2).fold(1) { a, d -> a * d })
    }

    private fun sliceShape(shape: IntArray, e: Element): IntArray {
        if (e.k == null) return shape
        val (_, cols, _) = dims(shape)
        if (e.k !in 1..cols) throw PockException(PockStatus.SHAPE, "slice ${e.name}[:, :${e.k}] does not fit ${PockTensor.shapeString(shape)}")
        return shape.copyOf().also { it[1] = e.k }
    }

    private fun slice(full: PockTensor, e: Element): PockTensor {
        val shape = sliceShape(full.shape, e)
        val (rows, cols, inner) = dims(full.shape)
        val src = full.toFloatArray()
        val out = FloatArray(rows * e.k!! * inner)
        for (r in 0 until rows) System.arraycopy(src, r * cols * inner, out, r * e.k * inner, e.k * inner)
        return PockTensor.of(out, *shape)
    }

    /** NumPy's .npy format (version 1.0), float32 little-endian, C order: Flower's tensor bytes. */
    object Npy {
        private val MAGIC = byteArrayOf(0x93.toByte(), 'N'.code.toByte(), 'U'.code.toByte(), 'M'.code.toByte(),
            'P'.code.toByte(), 'Y'.code.toByte())

        @JvmStatic
        fun encode(t: PockTensor): ByteArray {
            val values = t.toFloatArray()
            val shape = t.shape.joinToString(", ", "(", if (t.shape.size == 1) ",)" else ")")
            var header = "{'descr': '<f4', 'fortran_order': False, 'shape': $shape, }"
            val total = MAGIC.size + 2 + 2 + header.length + 1
            header += " ".repeat((64 - total % 64) % 64) + "\n"
            val out = ByteArrayOutputStream()
            out.write(MAGIC)
            out.write(byteArrayOf(1, 0, (header.length and 0xFF).toByte(), (header.length shr 8).toByte()))
            out.write(header.toByteArray(Charsets.US_ASCII))
            val body = ByteBuffer.allocate(values.size * 4).order(ByteOrder.LITTLE_ENDIAN)
            body.asFloatBuffer().put(values)
            out.write(body.array())
            return out.toByteArray()
        }

        @JvmStatic
        fun decode(bytes: ByteArray): PockTensor {
            fun bad(why: String): Nothing = throw PockException(PockStatus.INVALID_ARGUMENT, "not a float32 .npy array: $why")
            if (bytes.size < 10 || !bytes.copyOf(6).contentEquals(MAGIC)) bad("bad magic")
            val major = bytes[6].toInt()
            val (len, start) = if (major == 1) {
                ((bytes[8].toInt() and 0xFF) or ((bytes[9].toInt() and 0xFF) shl 8)) to 10
            } else {
                if (bytes.size < 12) bad("truncated")
                ByteBuffer.wrap(bytes, 8, 4).order(ByteOrder.LITTLE_ENDIAN).int to 12
            }
            if (len < 0 || start + len > bytes.size) bad("truncated header")
            val header = String(bytes, start, len, Charsets.US_ASCII)
            if ("'<f4'" !in header) bad("dtype is not '<f4': $header")
            if ("'fortran_order': True" in header) bad("Fortran order")
            val shapeText = Regex("'shape': \\(([^)]*)\\)").find(header)?.groupValues?.get(1) ?: bad("no shape")
            val shape = shapeText.split(",").map { it.trim() }.filter { it.isNotEmpty() }.map { it.toInt() }.toIntArray()
            val n = shape.fold(1) { a, d -> a * d }
            val offset = start + len
            if (bytes.size - offset != n * 4) bad("holds ${bytes.size - offset} data bytes, shape needs ${n * 4}")
            val values = FloatArray(n)
            ByteBuffer.wrap(bytes, offset, n * 4).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(values)
            return PockTensor.of(values, *shape)
        }
    }
}
