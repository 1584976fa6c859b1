package ai.pockengine

import java.nio.ByteBuffer
import java.nio.ByteOrder

/** Element types of pock.h's `pock_dtype`; [manifestName] is model.json's spelling. */
enum class PockDType(val code: Int, val bytes: Int, val manifestName: String) {
    FLOAT32(0, 4, "f32"),
    INT64(1, 8, "i64"),
    INT32(2, 4, "i32"), // accepted where the model wants int64 (widened on the copy into the arena)
    UINT8(3, 1, "u8"),
    // frozen weights stored in low precision (state tensors only; getTensor gives them in a direct buffer)
    BF16(4, 2, "bf16"),
    FLOAT16(5, 2, "f16"),
    INT8(6, 1, "i8");

    companion object {
        fun of(code: Int): PockDType =
            values().firstOrNull { it.code == code }
                ?: throw PockException(PockStatus.DTYPE, "pock_dtype $code is unknown to this SDK")

        fun fromManifest(name: String): PockDType =
            values().firstOrNull { it.manifestName == name }
                ?: throw PockException(PockStatus.DTYPE, "model.json names dtype '$name', which this SDK does not know")
    }
}

/**
 * A tensor handed to [PockTrainer.step] or [PockTrainer.forward], or returned
 * by forward or getTensor: a view of caller memory (a primitive array or a direct
 * [ByteBuffer]) plus its shape.  Nothing is copied or boxed; the native call
 * copies the data once, into the trainer's arena.
 *
 *     val x = PockTensor.of(tokens, 4, 16)          // IntArray of 64 token ids
 *     val y = PockTensor.of(nextTokens, 4, 16)
 *     val buf = PockTensor.of(direct, PockDType.FLOAT32, 1, 3, 224, 224)
 *
 * A direct buffer must be in native byte order; its data starts at its position.
 */
class PockTensor private constructor(
    /** The backing FloatArray / LongArray / IntArray / ByteArray, or a direct ByteBuffer. */
    val data: Any,
    val dtype: PockDType,
    shape: IntArray,
) {
    private val dims: IntArray = shape.copyOf()

    /** The dimensions (a copy). */
    val shape: IntArray get() = dims.copyOf()

    /** The number of elements (the product of the shape). */
    val numel: Long = dims.fold(1L) { acc, d -> acc * d }

    val nbytes: Long get() = numel * dtype.bytes

    init {
        if (dims.size > MAX_DIMS) bad("has ${dims.size} dims; pock.h allows at most $MAX_DIMS")
        if (dims.any { it < 0 }) bad("has a negative dimension in ${shapeString(dims)}")
        val have: Long = when (data) {
            is FloatArray -> data.size.toLong()
            is LongArray -> data.size.toLong()
            is IntArray -> data.size.toLong()
            is ByteArray -> data.size.toLong()
            is ByteBuffer -> {
                if (!data.isDirect) bad("is a heap ByteBuffer; use ByteBuffer.allocateDirect (or a primitive array)")
                if (data.order() != ByteOrder.nativeOrder()) {
                    bad("is a ${data.order()} ByteBuffer; call .order(ByteOrder.nativeOrder()) first")
                }
                data.remaining().toLong() / dtype.bytes
            }
            else -> bad("holds a ${data.javaClass.name}; use a primitive array or a direct ByteBuffer")
        }
        if (data is ByteBuffer) {
            if (have < numel) bad("needs ${numel * dtype.bytes} bytes for shape ${shapeString(dims)}, the buffer has ${data.remaining()} remaining")
        } else if (have != numel) {
            bad("has $have elements but shape ${shapeString(dims)} needs $numel")
        }
    }

    private fun bad(why: String): Nothing = throw PockException(PockStatus.SHAPE, "PockTensor ${dtype.manifestName} $why")

    /** The data as a FloatArray: the backing array itself, or a copy out of a direct buffer. */
    fun toFloatArray(): FloatArray {
        checkType(PockDType.FLOAT32)
        if (data is FloatArray) return data
        return FloatArray(numel.toInt()).also { (data as ByteBuffer).duplicate().order(ByteOrder.nativeOrder()).asFloatBuffer().get(it) }
    }

    /** The data as an IntArray: the backing array itself, or a copy out of a direct buffer. */
    fun toIntArray(): IntArray {
        checkType(PockDType.INT32)
        if (data is IntArray) return data
        return IntArray(numel.toInt()).also { (data as ByteBuffer).duplicate().order(ByteOrder.nativeOrder()).asIntBuffer().get(it) }
    }

    /** The raw bytes (native order) of any tensor: the backing ByteArray itself, else a copy. */
    fun toByteArray(): ByteArray {
        if (data is ByteArray) return data
        val out = ByteBuffer.allocate(nbytes.toInt()).order(ByteOrder.nativeOrder())
        when (data) {
            is FloatArray -> out.asFloatBuffer().put(data)
            is LongArray -> out.asLongBuffer().put(data)
            is IntArray -> out.asIntBuffer().put(data)
            is ByteBuffer -> out.put(data.duplicate().also { it.limit(it.position() + nbytes.toInt()) })
        }
        return out.array()
    }

    /** The data as a LongArray: the backing array itself, or a copy out of a direct buffer. */
    fun toLongArray(): LongArray {
        checkType(PockDType.INT64)
        if (data is LongArray) return data
        return LongArray(numel.toInt()).also { (data as ByteBuffer).duplicate().order(ByteOrder.nativeOrder()).asLongBuffer().get(it) }
    }

    private fun checkType(want: PockDType) {
        if (dtype != want) throw PockException(PockStatus.DTYPE, "this tensor is ${dtype.manifestName}, not ${want.manifestName}")
    }

    /** Offset in bytes of the first element inside a direct buffer (0 for arrays). */
    internal val byteOffset: Long get() = if (data is ByteBuffer) data.position().toLong() else 0L

    internal val dimsForNative: IntArray get() = dims

    override fun toString(): String = "PockTensor(${dtype.manifestName}${shapeString(dims)})"

    companion object {
        const val MAX_DIMS = 8

        @JvmStatic fun of(data: FloatArray, vararg shape: Int) = PockTensor(data, PockDType.FLOAT32, shape)
        @JvmStatic fun of(data: LongArray, vararg shape: Int) = PockTensor(data, PockDType.INT64, shape)
        @JvmStatic fun of(data: IntArray, vararg shape: Int) = PockTensor(data, PockDType.INT32, shape)
        @JvmStatic fun of(data: ByteArray, vararg shape: Int) = PockTensor(data, PockDType.UINT8, shape)
        @JvmStatic fun of(data: ByteBuffer, dtype: PockDType, vararg shape: Int) = PockTensor(data, dtype, shape)

        /** A zeroed tensor of [dtype] and [shape] backed by a new primitive array. */
        @JvmStatic fun zeros(dtype: PockDType, vararg shape: Int): PockTensor {
            val n = shape.fold(1L) { acc, d -> acc * d }
            if (n > Int.MAX_VALUE) throw PockException(PockStatus.SHAPE, "zeros: ${shapeString(shape)} is too large for an array")
            val count = n.toInt()
            val array: Any = when (dtype) {
                PockDType.FLOAT32 -> FloatArray(count)
                PockDType.INT64 -> LongArray(count)
                PockDType.INT32 -> IntArray(count)
                PockDType.UINT8 -> ByteArray(count)
                PockDType.BF16, PockDType.FLOAT16, PockDType.INT8 ->
                    return PockTensor(ByteBuffer.allocateDirect(count * dtype.bytes).order(ByteOrder.nativeOrder()), dtype, shape)
            }
            return PockTensor(array, dtype, shape)
        }

        internal fun shapeString(shape: IntArray): String = shape.joinToString(", ", "[", "]")
    }
}
