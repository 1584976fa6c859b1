import Foundation
import PockC

/// The model bundle's manifest (model.json, written by toolchain/pockengine/runtime/bundle.py):
/// the compiled inputs, targets and outputs with their shapes, the weights file,
/// and the frozen prefix that runs on Core ML before the compiled step, if any.
///
/// Validated once, with the Kotlin SDK's bounds (ModelBundle.kt): at most 4 MiB, JSON nesting
/// at most 64 deep, exact types (the decoder), dims >= 0 and <= 2^31-1, at most 8 dims, a
/// tensor that fits one buffer, the weights and prefix files inside the bundle (no "..", no
/// absolute path, no symlink escape); then the inputs, targets and outputs must be what the
/// loaded library reports through pock_io_info, the truth.  A violation is a PockError(.bundle)
/// naming the field.
public struct ModelManifest: Decodable {
    public struct IO: Decodable {
        public let name: String
        public let shape: [Int]
        public let dtype: String   // "f32", "i64", ...
    }

    public struct Prefix: Decodable {
        public struct CoreML: Decodable {
            public let path: String        // the .mlpackage, relative to the bundle
            public let compiled: String?   // a .mlmodelc compiled at build time (macOS builds)
            public let fp16: Bool
        }
        public let inputs: [IO]            // what the caller passes: the model's inputs
        public let outputs: [IO]           // what the compiled step takes instead of them
        public let coreml: CoreML?
    }

    public let format: Int
    public let name: String
    public let hash: String
    public let weights: String
    public let inputs: [IO]                // the compiled step's inputs
    public let targets: [IO]
    public let outputs: [IO]
    public let prefix: Prefix?

    static let maxManifestBytes = 4 << 20
    static let maxDepth = 64
    static let maxDims = 8
    static let maxTensorBytes = Int(Int32.max) - 8
    static let dtypeCodes: [String: (code: Int32, bytes: Int)] = [
        "f32": (0, 4), "i64": (1, 8), "i32": (2, 4), "u8": (3, 1), "bf16": (4, 2), "f16": (5, 2), "i8": (6, 1)]

    /// Reads and validates bundleURL/model.json.
    public static func load(bundleURL: URL) throws -> ModelManifest {
        let url = bundleURL.appendingPathComponent("model.json")
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw PockError(.bundle, "\(url.path): not a PockEngine model bundle: \(error)")
        }
        if data.count > maxManifestBytes {
            throw PockError(.bundle, "\(url.path): \(data.count) bytes, more than a manifest may hold (\(maxManifestBytes))")
        }
        try checkNesting(data, where: url.path)
        let m: ModelManifest
        do {
            m = try JSONDecoder().decode(ModelManifest.self, from: data)
        } catch {
            throw PockError(.bundle, "\(url.path): not a PockEngine model bundle: \(error)")
        }
        try m.validate(bundleURL: bundleURL, where: url.path)
        return m
    }

    /// JSON nested deeper than maxDepth is refused before it is decoded.
    static func checkNesting(_ data: Data, where path: String) throws {
        var depth = 0
        var inString = false
        var escaped = false
        for byte in data {
            if inString {
                if escaped { escaped = false } else if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { inString = false }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "["), UInt8(ascii: "{"):
                depth += 1
                if depth > maxDepth { throw PockError(.bundle, "\(path): JSON nesting deeper than \(maxDepth)") }
            case UInt8(ascii: "]"), UInt8(ascii: "}"): depth -= 1
            default: break
            }
        }
    }

    static func fieldError(_ path: String, _ field: String, _ why: String) -> PockError {
        PockError(.bundle, "\(path): manifest field '\(field)' \(why)")
    }

    /// bundleURL/rel when rel is relative, has no "..", and resolves (symlinks too) inside the bundle.
    static func checkInside(_ bundleURL: URL, _ rel: String, field: String, where path: String) throws {
        let parts = rel.split(separator: "/", omittingEmptySubsequences: false)
        if rel.isEmpty || rel.hasPrefix("/") || parts.contains("..") || rel.contains("\0") {
            throw fieldError(path, field, "('\(rel)') must name a file inside the bundle (a relative path without '..')")
        }
        let root = bundleURL.standardizedFileURL.resolvingSymlinksInPath().path
        let real = bundleURL.appendingPathComponent(rel).standardizedFileURL.resolvingSymlinksInPath().path
        if !real.hasPrefix(root + "/") {
            throw fieldError(path, field, "('\(rel)') resolves to \(real), outside the bundle \(root)")
        }
    }

    func validate(bundleURL: URL, where path: String) throws {
        if format != 1 { throw Self.fieldError(path, "format", "is \(format); this SDK reads 1") }
        try Self.checkInside(bundleURL, weights, field: "weights", where: path)
        let lists: [(String, [IO])] = [("inputs", inputs), ("targets", targets), ("outputs", outputs),
                                       ("prefix.inputs", prefix?.inputs ?? []), ("prefix.outputs", prefix?.outputs ?? [])]
        for (key, list) in lists {
            for (i, io) in list.enumerated() { try io.check(field: "\(key)[\(i)]", where: path) }
        }
        if let coreml = prefix?.coreml {
            try Self.checkInside(bundleURL, coreml.path, field: "prefix.coreml.path", where: path)
            if let compiled = coreml.compiled {
                try Self.checkInside(bundleURL, compiled, field: "prefix.coreml.compiled", where: path)
            }
        }
    }

    /// The manifest's inputs, targets and outputs must be what the loaded library computes
    /// (pock_io_info): output buffers are sized from them.
    func checkAgainstLibrary(where path: String) throws {
        let groups: [(Int32, String, [IO])] = [(0, "inputs", inputs), (1, "targets", targets), (2, "outputs", outputs)]
        for (group, key, list) in groups {
            let count = Int(pock_io_count(group))
            if count != list.count {
                throw Self.fieldError(path, key, "lists \(list.count) tensors; the library has \(count)")
            }
            for (i, io) in list.enumerated() {
                var info = pock_tensor_info()
                try check(pock_io_info(group, Int32(i), &info))
                let ndim = Int(info.ndim)
                let dims = withUnsafeBytes(of: info.shape) { raw in raw.bindMemory(to: Int64.self).prefix(ndim).map { Int($0) } }
                if Self.dtypeCodes[io.dtype]?.code != info.dtype || dims != io.shape {
                    throw Self.fieldError(path, "\(key)[\(i)]", "is \(io.dtype)\(io.shape); the library computes dtype \(info.dtype) \(dims)")
                }
            }
        }
    }
}

extension ModelManifest.IO {
    func check(field: String, where path: String) throws {
        if shape.count > ModelManifest.maxDims {
            throw ModelManifest.fieldError(path, "\(field).shape", "has \(shape.count) dims, more than \(ModelManifest.maxDims)")
        }
        guard let bytes = ModelManifest.dtypeCodes[dtype]?.bytes else {
            throw ModelManifest.fieldError(path, "\(field).dtype", "is '\(dtype)', which this SDK does not know")
        }
        var total = bytes
        for (d, n) in shape.enumerated() {
            if n < 0 { throw ModelManifest.fieldError(path, "\(field).shape[\(d)]", "is \(n); a dimension must be >= 0") }
            if n > Int(Int32.max) {
                throw ModelManifest.fieldError(path, "\(field).shape[\(d)]", "is \(n), more than \(Int32.max)")
            }
            let (product, overflow) = total.multipliedReportingOverflow(by: n)
            total = overflow || product > ModelManifest.maxTensorBytes ? ModelManifest.maxTensorBytes + 1 : product
        }
        if total > ModelManifest.maxTensorBytes {
            throw ModelManifest.fieldError(path, "\(field).shape", "\(shape) of \(dtype) needs more than \(ModelManifest.maxTensorBytes) bytes")
        }
    }
}
