package ai.pockengine

/** The status codes of pock.h's `pock_status`, by name. */
enum class PockStatus(val code: Int) {
    OK(0),
    INVALID_ARGUMENT(1),
    SHAPE(2),
    DTYPE(3),
    VALUE(4),
    IO(5),
    CHECKPOINT(6),
    CLOSED(7),
    NO_MEMORY(8),
    BACKEND(9),
    INTERNAL(10),
    /** step: an input, the loss or a gradient was NaN/inf; the update was skipped. */
    NONFINITE(11),
    /** step: every class target was the ignore index (no real token); the step was skipped. */
    NO_TARGETS(12);

    companion object {
        fun of(code: Int): PockStatus = values().firstOrNull { it.code == code } ?: INTERNAL
    }
}

/**
 * Every failure of the SDK: a failing C API call (the message is
 * `pock_last_error()`, the status its `pock_status`), a bad argument caught
 * before the native call, or a use of a closed trainer ([PockStatus.CLOSED]).
 */
class PockException(val status: PockStatus, message: String, cause: Throwable? = null) :
    RuntimeException(message, cause) {

    /** Used by pock_jni.cpp: (pock_status code, pock_last_error()). */
    constructor(code: Int, message: String) : this(PockStatus.of(code), message)

    override fun toString(): String = "PockException(${status.name}): $message"
}
