import Foundation

/// The model bundle's manifest (model.json, written by toolchain/pockengine/bundle.py):
/// the compiled inputs, targets and outputs with their shapes, the weights file,
/// and the frozen prefix that runs on Core ML before the compiled step, if any.
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

    /// Reads bundleURL/model.json.
    public static func load(bundleURL: URL) throws -> ModelManifest {
        let url = bundleURL.appendingPathComponent("model.json")
        do {
            return try JSONDecoder().decode(ModelManifest.self, from: Data(contentsOf: url))
        } catch {
            throw PockError(.bundle, "\(url.path): not a PockEngine model bundle: \(error)")
        }
    }
}
