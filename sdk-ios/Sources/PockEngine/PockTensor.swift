import PockC

/// A tensor for step/forward (and what forward and tensor(named:) return): values in
/// row-major order and their shape.
///
/// Arrays are borrowed for the duration of a call, never copied.  The
/// `UnsafeBufferPointer` forms let you pass memory you own; it must stay valid
/// until the call returns.  Int32 values are accepted where the model wants int64.
public struct PockTensor: @unchecked Sendable {
    public enum Values {
        case float([Float])
        case int32([Int32])
        case int64([Int64])
        case floatBuffer(UnsafeBufferPointer<Float>)
        case int32Buffer(UnsafeBufferPointer<Int32>)
        case uint8([UInt8])
        /// Raw little-endian elements of a low-precision state tensor (bf16/f16/int8 frozen weights).
        case raw([UInt8], dtype: Int32)
    }

    public private(set) var values: Values
    public let shape: [Int]

    public init(_ values: [Float], shape: [Int]) { self.values = .float(values); self.shape = shape }
    public init(_ values: [Int32], shape: [Int]) { self.values = .int32(values); self.shape = shape }
    public init(_ values: [Int64], shape: [Int]) { self.values = .int64(values); self.shape = shape }
    public init(_ values: UnsafeBufferPointer<Float>, shape: [Int]) { self.values = .floatBuffer(values); self.shape = shape }
    public init(_ values: UnsafeBufferPointer<Int32>, shape: [Int]) { self.values = .int32Buffer(values); self.shape = shape }
    public init(_ values: [UInt8], shape: [Int]) { self.values = .uint8(values); self.shape = shape }
    public init(values: Values, shape: [Int]) { self.values = values; self.shape = shape }

    /// A zeroed tensor of pock_dtype `dtype` (what forward and tensor(named:) fill).
    static func zeros(dtype: Int32, shape: [Int]) -> PockTensor {
        let n = shape.reduce(1, *)
        switch dtype {
        case Int32(POCK_F32.rawValue): return PockTensor([Float](repeating: 0, count: n), shape: shape)
        case Int32(POCK_I64.rawValue): return PockTensor([Int64](repeating: 0, count: n), shape: shape)
        case Int32(POCK_I32.rawValue): return PockTensor([Int32](repeating: 0, count: n), shape: shape)
        case Int32(POCK_U8.rawValue): return PockTensor([UInt8](repeating: 0, count: n), shape: shape)
        default:
            let size = dtype == Int32(POCK_I8.rawValue) ? 1 : 2
            return PockTensor(values: .raw([UInt8](repeating: 0, count: n * size), dtype: dtype), shape: shape)
        }
    }

    /// The pock_dtype of the values.
    public var dtype: Int32 {
        switch values {
        case .float, .floatBuffer: return Int32(POCK_F32.rawValue)
        case .int32, .int32Buffer: return Int32(POCK_I32.rawValue)
        case .int64: return Int32(POCK_I64.rawValue)
        case .uint8: return Int32(POCK_U8.rawValue)
        case .raw(_, let dtype): return dtype
        }
    }

    /// Calls body with the tensor's bytes as mutable memory (forward and tensor(named:) fill it).
    mutating func withMutableBytes<R>(_ body: (UnsafeMutableRawBufferPointer) throws -> R) rethrows -> R {
        switch values {
        case .float(var v): defer { values = .float(v) }; return try v.withUnsafeMutableBytes(body)
        case .int32(var v): defer { values = .int32(v) }; return try v.withUnsafeMutableBytes(body)
        case .int64(var v): defer { values = .int64(v) }; return try v.withUnsafeMutableBytes(body)
        case .uint8(var v): defer { values = .uint8(v) }; return try v.withUnsafeMutableBytes(body)
        case .raw(var v, let d): defer { values = .raw(v, dtype: d) }; return try v.withUnsafeMutableBytes(body)
        case .floatBuffer(let v): return try body(UnsafeMutableRawBufferPointer(mutating: UnsafeRawBufferPointer(v)))
        case .int32Buffer(let v): return try body(UnsafeMutableRawBufferPointer(mutating: UnsafeRawBufferPointer(v)))
        }
    }

    /// The bytes of the values (for setTensor(_:named:)).
    func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch values {
        case .float(let v): return try v.withUnsafeBytes(body)
        case .int32(let v): return try v.withUnsafeBytes(body)
        case .int64(let v): return try v.withUnsafeBytes(body)
        case .uint8(let v): return try v.withUnsafeBytes(body)
        case .raw(let v, _): return try v.withUnsafeBytes(body)
        case .floatBuffer(let v): return try body(UnsafeRawBufferPointer(v))
        case .int32Buffer(let v): return try body(UnsafeRawBufferPointer(v))
        }
    }

    public var count: Int {
        switch values {
        case .float(let v): return v.count
        case .int32(let v): return v.count
        case .int64(let v): return v.count
        case .floatBuffer(let v): return v.count
        case .int32Buffer(let v): return v.count
        case .uint8(let v): return v.count
        case .raw(let v, let d): return v.count / (d == Int32(POCK_I8.rawValue) ? 1 : 2)
        }
    }

    /// The floats of a float tensor (nil for integer tensors).
    public var floats: [Float]? {
        switch values {
        case .float(let v): return v
        case .floatBuffer(let v): return Array(v)
        default: return nil
        }
    }

    /// The values of an int64 tensor (nil for others).
    public var int64s: [Int64]? {
        if case .int64(let v) = values { return v }
        return nil
    }

    /// Calls body with a pock_tensor viewing this tensor's memory.  The C API reads
    /// product(shape) elements, so the count is checked here first.
    func withCTensor<R>(_ body: (pock_tensor) throws -> R) throws -> R {
        let elements = shape.reduce(1, *)
        guard elements == count else {
            throw PockError(.shape, "tensor of shape \(shape) needs \(elements) values, got \(count)")
        }
        let dims = shape.map { Int64($0) }
        return try dims.withUnsafeBufferPointer { dimsPtr in
            func view(_ data: UnsafeRawPointer?, _ dtype: pock_dtype) throws -> R {
                try body(pock_tensor(data: data, dtype: Int32(dtype.rawValue), ndim: Int32(dims.count),
                                     shape: dimsPtr.baseAddress))
            }
            switch values {
            case .float(let v): return try v.withUnsafeBytes { try view($0.baseAddress, POCK_F32) }
            case .int32(let v): return try v.withUnsafeBytes { try view($0.baseAddress, POCK_I32) }
            case .int64(let v): return try v.withUnsafeBytes { try view($0.baseAddress, POCK_I64) }
            case .floatBuffer(let v): return try view(UnsafeRawPointer(v.baseAddress), POCK_F32)
            case .int32Buffer(let v): return try view(UnsafeRawPointer(v.baseAddress), POCK_I32)
            case .uint8(let v): return try v.withUnsafeBytes { try view($0.baseAddress, POCK_U8) }
            case .raw(let v, let d): return try v.withUnsafeBytes { try view($0.baseAddress, pock_dtype(rawValue: UInt32(d))) }
            }
        }
    }
}

/// Calls body with a contiguous array of pock_tensor views of `tensors`.
func withCTensors<R>(_ tensors: [PockTensor], _ body: (UnsafeBufferPointer<pock_tensor>) throws -> R) throws -> R {
    func gather(_ rest: ArraySlice<PockTensor>, _ views: [pock_tensor]) throws -> R {
        guard let first = rest.first else { return try views.withUnsafeBufferPointer { try body($0) } }
        return try first.withCTensor { try gather(rest.dropFirst(), views + [$0]) }
    }
    return try gather(tensors[...], [])
}
