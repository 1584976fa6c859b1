import CoreML
import Foundation
import PockC

/// One compiled model's trainer: a thin layer over the C API (pock.h).  Each
/// method below calls one C function (step also runs the Core ML prefix first).
///
///     let trainer = try PockTrainer(modelURL: bundleURL)
///     let loss = try trainer.step(inputs: [PockTensor(tokens, shape: [4, 16])],
///                                 targets: [PockTensor(next, shape: [4, 16])])
///     try trainer.save(to: checkpointURL)
///
/// Thread safety: every method takes the trainer's lock, so a PockTrainer may
/// be shared between threads; its calls run one at a time, as pock.h requires.
/// Different trainers run in parallel.  deinit frees the native trainer.
public final class PockTrainer: @unchecked Sendable {
    public struct Options {
        /// Start from this checkpoint (one written by save(to:)) instead of the bundle's weights.
        public var checkpointURL: URL?
        /// Where Core ML may run the frozen prefix, if the bundle has one.
        public var computeUnits: MLComputeUnits

        public init(checkpointURL: URL? = nil, computeUnits: MLComputeUnits = .all) {
            self.checkpointURL = checkpointURL
            self.computeUnits = computeUnits
        }
    }

    /// The bundle's model.json: compiled inputs, targets and outputs.
    public let manifest: ModelManifest
    private let handle: OpaquePointer
    private let prefix: CoreMLPrefix?
    private let lock = NSLock()

    /// Opens the model bundle at modelURL (a folder with model.json and weights.pockckpt).
    public init(modelURL: URL, options: Options = Options()) throws {
        manifest = try ModelManifest.load(bundleURL: modelURL)
        prefix = try manifest.prefix.map {
            try CoreMLPrefix(bundleURL: modelURL, entry: $0, modelHash: manifest.hash, computeUnits: options.computeUnits)
        }
        try manifest.checkAgainstLibrary(where: modelURL.path)  // buffers are sized from what the library computes
        let weights = options.checkpointURL ?? modelURL.appendingPathComponent(manifest.weights)
        var opened: OpaquePointer?
        try check(pock_open(weights.path, &opened))
        handle = opened!
    }

    deinit {
        pock_close(handle)
    }

    /// One training step (forward, loss, backward, optimizer update); returns the loss.
    /// `inputs` are the model's inputs (the prefix's inputs when Core ML runs a prefix).
    public func step(inputs: [PockTensor], targets: [PockTensor]) throws -> Float {
        try locked {
            let stepInputs = try prefix?.stepInputs(inputs, compiled: manifest.inputs) ?? inputs
            var loss: Float = 0
            try withCTensors(stepInputs) { ins in
                try withCTensors(targets) { tgs in
                    try check(pock_step(handle, ins.baseAddress, Int32(ins.count), tgs.baseAddress, Int32(tgs.count), &loss))
                }
            }
            return loss
        }
    }

    /// Inference (eval mode) with the current weights: one float tensor per model output.
    public func predict(inputs: [PockTensor]) throws -> [PockTensor] {
        try locked {
            let stepInputs = try prefix?.stepInputs(inputs, compiled: manifest.inputs) ?? inputs
            let buffers = manifest.outputs.map { UnsafeMutableBufferPointer<Float>.allocate(capacity: $0.shape.reduce(1, *)) }
            defer { buffers.forEach { $0.deallocate() } }
            var views = buffers.map { pock_buffer(data: UnsafeMutableRawPointer($0.baseAddress), nbytes: Int64($0.count * 4)) }
            try withCTensors(stepInputs) { ins in
                try check(pock_forward(handle, ins.baseAddress, Int32(ins.count), &views, Int32(views.count)))
            }
            return zip(buffers, manifest.outputs).map { PockTensor(Array($0), shape: $1.shape) }
        }
    }

    /// Writes weights, optimizer state, step count and learning rate (atomically).
    public func save(to url: URL) throws {
        try locked { try check(pock_save(handle, url.path)) }
    }

    /// Replaces the state with a checkpoint's; a bad file changes nothing.
    public func restore(from url: URL) throws {
        try locked { try check(pock_load(handle, url.path)) }
    }

    public var learningRate: Float {
        get throws {
            try locked {
                var lr: Float = 0
                try check(pock_get_learning_rate(handle, &lr))
                return lr
            }
        }
    }

    public func setLearningRate(_ lr: Float) throws {
        try locked { try check(pock_set_learning_rate(handle, lr)) }
    }

    /// Optimizer steps taken (restored with a checkpoint).
    public var stepCount: Int {
        get throws {
            try locked {
                var steps: Int64 = 0
                try check(pock_step_count(handle, &steps))
                return Int(steps)
            }
        }
    }

    /// Threads of the trainer's pool (default: all cores).
    public func setNumThreads(_ n: Int) throws {
        try locked { try check(pock_set_num_threads(handle, Int32(n))) }
    }

    /// step(inputs:targets:) off the calling thread: `let loss = try await trainer.stepAsync(...)`.
    public func stepAsync(inputs: [PockTensor], targets: [PockTensor],
                          priority: TaskPriority = .utility) async throws -> Float {
        try await Task.detached(priority: priority) { try self.step(inputs: inputs, targets: targets) }.value
    }

    /// Background training: one step per batch, off the calling thread; returns the losses.
    /// Stops early (returning the losses so far) when the task is cancelled.
    public func train(batches: [(inputs: [PockTensor], targets: [PockTensor])],
                      priority: TaskPriority = .utility) async throws -> [Float] {
        try await Task.detached(priority: priority) {
            var losses: [Float] = []
            for batch in batches where !Task.isCancelled {
                losses.append(try self.step(inputs: batch.inputs, targets: batch.targets))
            }
            return losses
        }.value
    }

    private func locked<R>(_ body: () throws -> R) throws -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}
