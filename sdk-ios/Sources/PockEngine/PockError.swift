import PockC

/// A failed PockEngine call.  `code` is the C API's pock_status (or one of the
/// Swift layer's own codes); `message` is pock_last_error()'s text, which names
/// the problem (the tensor, the shape, the file).
public struct PockError: Error, CustomStringConvertible {
    public enum Code: Int32 {
        case invalidArgument = 1, shape, dtype, value, io, checkpoint, closed, noMemory, backend, internalError
        case nonFinite = 11 // step: an input, the loss or a gradient was NaN/inf; the update was skipped
        case noTargets = 12 // step: every class target was the ignore index (no real token); skipped
        case bundle = 100   // model.json is missing or unreadable
        case coreML = 101   // the Core ML prefix failed to load or run
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "PockError(\(code)): \(message)" }
}

/// Throws the C API's error unless `status` is POCK_OK.
func check(_ status: pock_status) throws {
    if status == POCK_OK { return }
    let code = PockError.Code(rawValue: Int32(status.rawValue)) ?? .internalError
    throw PockError(code, String(cString: pock_last_error()))
}
