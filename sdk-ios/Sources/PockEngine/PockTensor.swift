import PockC

/// A tensor for step/predict: values in row-major order and their shape.
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
    }

    public let values: Values
    public let shape: [Int]

    public init(_ values: [Float], shape: [Int]) { self.values = .float(values); self.shape = shape }
    public init(_ values: [Int32], shape: [Int]) { self.values = .int32(values); self.shape = shape }
    public init(_ values: [Int64], shape: [Int]) { self.values = .int64(values); self.shape = shape }
    public init(_ values: UnsafeBufferPointer<Float>, shape: [Int]) { self.values = .floatBuffer(values); self.shape = shape }
    public init(_ values: UnsafeBufferPointer<Int32>, shape: [Int]) { self.values = .int32Buffer(values); self.shape = shape }

    public var count: Int {
        switch values {
        case .float(let v): return v.count
        case .int32(let v): return v.count
        case .int64(let v): return v.count
        case .floatBuffer(let v): return v.count
        case .int32Buffer(let v): return v.count
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
