import CoreML
import Foundation

/// The bundle's frozen prefix (the part of the forward pass no gradient flows
/// through), run by Core ML just before each compiled step or forward.  The
/// compiled step's inputs are the prefix's outputs, matched by name; an input
/// the prefix does not produce is passed through from the caller.
final class CoreMLPrefix {
    let entry: ModelManifest.Prefix
    private let model: MLModel

    init(bundleURL: URL, entry: ModelManifest.Prefix, modelHash: String, computeUnits: MLComputeUnits) throws {
        guard let coreml = entry.coreml else {
            throw PockError(.coreML, "the bundle has a frozen prefix but no Core ML model: build with pock-build --coreml")
        }
        self.entry = entry
        let config = MLModelConfiguration()
        config.computeUnits = computeUnits
        do {
            let compiled = try coreml.compiled.map { bundleURL.appendingPathComponent($0) }
                ?? Self.compileOnce(bundleURL.appendingPathComponent(coreml.path), key: modelHash)
            model = try MLModel(contentsOf: compiled, configuration: config)
        } catch {
            throw PockError(.coreML, "cannot load the Core ML prefix \(coreml.path): \(error)")
        }
    }

    /// Compiles the .mlpackage at first run and keeps the .mlmodelc in Caches (one per model hash).
    private static func compileOnce(_ package: URL, key: String) throws -> URL {
        let fm = FileManager.default
        let dir = try fm.url(for: .cachesDirectory, in: .userDomainMask, appropriateFor: nil, create: true)
            .appendingPathComponent("PockEngine", isDirectory: true)
        let dest = dir.appendingPathComponent("\(key).mlmodelc")
        if fm.fileExists(atPath: dest.path) { return dest }
        let temporary = try MLModel.compileModel(at: package)
        try fm.createDirectory(at: dir, withIntermediateDirectories: true)
        try? fm.removeItem(at: dest)
        try fm.moveItem(at: temporary, to: dest)
        return dest
    }

    /// Runs the prefix on the caller's inputs; returns the compiled step's inputs.
    func stepInputs(_ inputs: [PockTensor], compiled: [ModelManifest.IO]) throws -> [PockTensor] {
        guard inputs.count == entry.inputs.count else {
            throw PockError(.invalidArgument, "expected \(entry.inputs.count) inputs (\(entry.inputs.map(\.name))), got \(inputs.count)")
        }
        var features: [String: MLFeatureValue] = [:]
        var byName: [String: PockTensor] = [:]
        for (io, tensor) in zip(entry.inputs, inputs) {
            guard tensor.shape == io.shape else {
                throw PockError(.shape, "input '\(io.name)' must have shape \(io.shape), got \(tensor.shape)")
            }
            features[io.name] = MLFeatureValue(multiArray: try tensor.multiArray())
            byName[io.name] = tensor
        }
        let result: MLFeatureProvider
        do {
            result = try model.prediction(from: MLDictionaryFeatureProvider(dictionary: features))
        } catch {
            throw PockError(.coreML, "Core ML prefix prediction failed: \(error)")
        }
        for io in entry.outputs {
            guard let array = result.featureValue(for: io.name)?.multiArrayValue else {
                throw PockError(.coreML, "the Core ML prefix did not return '\(io.name)'")
            }
            byName[io.name] = PockTensor(floatsOf: array, shape: io.shape)
        }
        return try compiled.map { io in
            guard let tensor = byName[io.name] else {
                throw PockError(.invalidArgument, "compiled input '\(io.name)' is neither a prefix output nor an input")
            }
            return tensor
        }
    }
}

extension PockTensor {
    /// A Core ML copy: float32, or int32 for integer tensors (Core ML has no int64 inputs).
    func multiArray() throws -> MLMultiArray {
        let isFloat = floats != nil
        let array = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: isFloat ? .float32 : .int32)
        let n = count
        switch values {
        case .float(let v): v.withUnsafeBytes { array.dataPointer.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        case .floatBuffer(let v): array.dataPointer.copyMemory(from: v.baseAddress!, byteCount: n * 4)
        case .int32(let v): v.withUnsafeBytes { array.dataPointer.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        case .int32Buffer(let v): array.dataPointer.copyMemory(from: v.baseAddress!, byteCount: n * 4)
        case .int64(let v):
            let dst = array.dataPointer.bindMemory(to: Int32.self, capacity: n)
            for i in 0..<n { dst[i] = Int32(truncatingIfNeeded: v[i]) }
        }
        return array
    }

    /// A float tensor of `shape` read from a Core ML output, which may be float16 or
    /// have padded strides (the Neural Engine pads rows).
    init(floatsOf array: MLMultiArray, shape: [Int]) {
        let n = shape.reduce(1, *)
        var rowMajor = [Int](repeating: 1, count: shape.count)
        for d in stride(from: shape.count - 2, through: 0, by: -1) { rowMajor[d] = rowMajor[d + 1] * shape[d + 1] }
        var out = [Float](repeating: 0, count: n)
        if array.dataType == .float32 && array.strides.map(\.intValue) == rowMajor {
            out.withUnsafeMutableBytes { $0.copyMemory(from: UnsafeRawBufferPointer(start: array.dataPointer, count: n * 4)) }
        } else {
            for i in 0..<n {  // slow path: element by element through the strides
                let index = zip(rowMajor, shape).map { NSNumber(value: (i / $0) % $1) }
                out[i] = array[index].floatValue
            }
        }
        self.init(out, shape: shape)
    }
}
