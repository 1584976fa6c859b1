import CoreML
import Foundation
import PockC

/// What the last step did: Python's `last_step_status`, Kotlin's `PockStepStatus`.
public enum PockStepStatus: Sendable {
    case ok
    /// A NaN/inf input, loss or gradient: no update applied, counted in `skippedSteps`.
    case skipped
    /// A gradient found non-finite after some of the step's updates ran (exact_skip=False models).
    case partial
}

/// One step of `train(batches:onProgress:)`, handed to its progress callback.
public struct PockProgress: Sendable {
    public let step: Int
    public let loss: Float
    public let status: PockStepStatus
    public let skippedSteps: Int
}

/// What `train(batches:onProgress:)` did: one loss per step (NaN/inf for skipped ones).
public struct PockTrainResult: Sendable {
    public let losses: [Float]
    public let skipped: Int
}

/// One node of the training step timed by `profile(inputs:targets:steps:warmup:)`.
public struct PockNodeTime: Sendable {
    public let index: Int
    public let phase: String, op: String, kernel: String, module: String
    public let flops: Int64
    /// Mean milliseconds per step in this node.
    public let ms: Double
}

/// Per-node times (Python's `trainer.profile` rows) and the measured time per step.
public struct PockProfile: Sendable {
    public let nodes: [PockNodeTime]
    public let steps: Int
    public let stepMs: Double
    public let losses: [Float]
}

/// A state tensor of the compiled model (parameter, buffer, optimizer state or constant).
public struct StateTensorSpec: Sendable {
    public let name: String
    public let dtype: Int32   // pock_dtype
    public let shape: [Int]
    public let kind: Int32    // pock_tensor_kind
}

/// One compiled model's trainer: a thin layer over the C API (pock.h), with the
/// vocabulary of Python's Trainer and Kotlin's PockTrainer.  Each method below
/// calls one C function (step and forward also run the Core ML prefix first).
///
///     let trainer = try PockTrainer(modelURL: bundleURL)
///     let loss = try trainer.step(inputs: [PockTensor(tokens, shape: [4, 16])],
///                                 targets: [PockTensor(next, shape: [4, 16])])
///     try trainer.save(to: checkpointURL, trainedOnly: true)
///
/// Bad batches: a NaN/inf batch applies no update and does not throw; it sets
/// `lastStepStatus` to `.skipped` and counts in `skippedSteps` (unless
/// `Options.strict`, where it throws `PockError(.nonFinite, ...)`).  A batch with
/// no real target (every label the ignore index) is skipped and counted the same
/// way, strict or not, with loss 0.
///
/// Thread safety: every method takes the trainer's lock, so a PockTrainer may
/// be shared between threads; its calls run one at a time, as pock.h requires.
/// Different trainers run in parallel.  close() (or deinit) frees the native trainer.
public final class PockTrainer: @unchecked Sendable {
    public struct Options {
        /// Start from this checkpoint (one written by save(to:)) instead of the bundle's weights.
        public var checkpointURL: URL?
        /// Where Core ML may run the frozen prefix, if the bundle has one.
        public var computeUnits: MLComputeUnits
        /// Non-finite batches throw instead of being skipped and counted.
        public var strict: Bool

        public init(checkpointURL: URL? = nil, computeUnits: MLComputeUnits = .all, strict: Bool = false) {
            self.checkpointURL = checkpointURL
            self.computeUnits = computeUnits
            self.strict = strict
        }
    }

    /// The bundle's model.json: compiled inputs, targets and outputs.
    public let manifest: ModelManifest
    private var handle: OpaquePointer?
    private let prefix: CoreMLPrefix?
    private let strict: Bool
    private let lock = NSLock()

    /// What the last step did (.ok before any step).
    public private(set) var lastStepStatus: PockStepStatus = .ok
    /// The last skipped step's message; empty after an applied step.
    public private(set) var lastStepMessage: String = ""
    /// Steps that applied no update: a non-finite batch, or one with no real target.
    public private(set) var skippedSteps: Int = 0

    /// Opens the model bundle at modelURL (a folder with model.json and weights.pockckpt).
    public init(modelURL: URL, options: Options = Options()) throws {
        manifest = try ModelManifest.load(bundleURL: modelURL)
        prefix = try manifest.prefix.map {
            try CoreMLPrefix(bundleURL: modelURL, entry: $0, modelHash: manifest.hash, computeUnits: options.computeUnits)
        }
        try manifest.checkAgainstLibrary(where: modelURL.path)  // buffers are sized from what the library computes
        strict = options.strict
        let weights = options.checkpointURL ?? modelURL.appendingPathComponent(manifest.weights)
        var opened: OpaquePointer?
        try check(pock_open(weights.path, &opened))
        handle = opened
    }

    deinit {
        pock_close(handle)
    }

    /// Frees the native trainer; idempotent.  Later calls throw PockError(.closed, ...).
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        pock_close(handle)
        handle = nil
    }

    /// One training step (forward, loss, backward, optimizer update); returns the loss.
    /// `inputs` are the model's inputs (the prefix's inputs when Core ML runs a prefix).
    public func step(inputs: [PockTensor], targets: [PockTensor]) throws -> Float {
        try locked { h in
            let stepInputs = try prefix?.stepInputs(inputs, compiled: manifest.inputs) ?? inputs
            var loss: Float = 0
            var status = POCK_OK
            try withCTensors(stepInputs) { ins in
                try withCTensors(targets) { tgs in
                    status = pock_step(h, ins.baseAddress, Int32(ins.count), tgs.baseAddress, Int32(tgs.count), &loss)
                }
            }
            if status == POCK_ERR_NO_TARGETS {  // every label ignore_index: nothing to learn from, skipped even when strict
                skippedSteps += 1
                lastStepMessage = String(cString: pock_last_error())
                lastStepStatus = .skipped
                return loss
            }
            if status == POCK_ERR_NONFINITE {
                let why = String(cString: pock_last_error())
                skippedSteps += 1
                lastStepMessage = why
                lastStepStatus = why.contains("earlier update(s)") ? .partial : .skipped
                if strict { throw PockError(.nonFinite, why) }
                return loss
            }
            try check(status)
            lastStepStatus = .ok
            lastStepMessage = ""
            return loss
        }
    }

    /// Trains on `batches`, checking for Task cancellation before every step
    /// (`Task.checkCancellation()`: a cancelled task throws CancellationError after the
    /// step in flight, with every finished step applied); `onProgress` runs after each step.
    public func train(batches: [(inputs: [PockTensor], targets: [PockTensor])],
                      onProgress: ((PockProgress) -> Void)? = nil) async throws -> PockTrainResult {
        var losses: [Float] = []
        var skipped = 0
        for batch in batches {
            try Task.checkCancellation()
            let loss = try self.step(inputs: batch.inputs, targets: batch.targets)
            let status = lastStepStatus
            if status != .ok { skipped += 1 }
            losses.append(loss)
            onProgress?(PockProgress(step: losses.count, loss: loss, status: status, skippedSteps: skippedSteps))
        }
        return PockTrainResult(losses: losses, skipped: skipped)
    }

    /// Inference (eval mode) with the current weights: one tensor per model output, of its dtype.
    public func forward(inputs: [PockTensor]) throws -> [PockTensor] {
        var outputs = manifest.outputs.map { PockTensor.zeros(dtype: dtypeCode($0.dtype), shape: $0.shape) }
        try forward(inputs: inputs, into: &outputs)
        return outputs
    }

    /// Inference into caller-owned outputs of the compiled shapes and dtypes (their arrays, or
    /// the memory an UnsafeBufferPointer tensor views, get the results).
    public func forward(inputs: [PockTensor], into outputs: inout [PockTensor]) throws {
        try locked { h in
            let stepInputs = try prefix?.stepInputs(inputs, compiled: manifest.inputs) ?? inputs
            guard outputs.count == manifest.outputs.count else {
                throw PockError(.invalidArgument, "forward: the model has \(manifest.outputs.count) outputs, got \(outputs.count)")
            }
            let buffers = outputs.map {
                UnsafeMutableRawBufferPointer.allocate(byteCount: $0.withBytes { $0.count }, alignment: 64)
            }
            defer { buffers.forEach { $0.deallocate() } }
            var views = buffers.map { pock_buffer(data: $0.baseAddress, nbytes: Int64($0.count)) }
            try withCTensors(stepInputs) { ins in
                try check(pock_forward(h, ins.baseAddress, Int32(ins.count), &views, Int32(views.count)))
            }
            for i in outputs.indices {
                outputs[i].withMutableBytes { $0.copyMemory(from: UnsafeRawBufferPointer(buffers[i])) }
            }
        }
    }

    /// Writes a checkpoint atomically: all state, or with trainedOnly only the trained
    /// tensors, buffers and optimizer state, tied to the base weights by hash.
    public func save(to url: URL, trainedOnly: Bool = false) throws {
        try locked { h in try check(trainedOnly ? pock_save_trained(h, url.path) : pock_save(h, url.path)) }
    }

    /// Replaces the state with a checkpoint's (full or trained-only); a bad file changes nothing.
    public func load(from url: URL) throws {
        try locked { h in try check(pock_load(h, url.path)) }
    }

    /// The compiled model's state tensors, in model order.
    public var stateTensors: [StateTensorSpec] {
        (0..<pock_tensor_count()).compactMap { i in
            var info = pock_tensor_info()
            guard pock_tensor_info_at(i, &info) == POCK_OK else { return nil }
            let shape = withUnsafeBytes(of: info.shape) { Array($0.bindMemory(to: Int64.self).prefix(Int(info.ndim))) }
            return StateTensorSpec(name: String(cString: info.name), dtype: info.dtype, shape: shape.map { Int($0) },
                                   kind: info.kind)
        }
    }

    /// A copy of the state tensor `name` (parameter, buffer, optimizer state "<param>:<slot>").
    public func tensor(named name: String) throws -> PockTensor {
        guard let spec = stateTensors.first(where: { $0.name == name }) else {
            throw PockError(.invalidArgument, "model '\(manifest.name)' has no state tensor '\(name)'")
        }
        var out = PockTensor.zeros(dtype: spec.dtype, shape: spec.shape)
        try locked { h in
            try out.withMutableBytes { try check(pock_get_tensor(h, name, $0.baseAddress, Int64($0.count))) }
        }
        return out
    }

    /// Overwrites the state tensor `name` with `value` (its dtype and shape).
    public func setTensor(_ value: PockTensor, named name: String) throws {
        try locked { h in
            try value.withBytes { try check(pock_set_tensor(h, name, $0.baseAddress, Int64($0.count))) }
        }
    }

    public var learningRate: Float {
        get throws {
            try locked { h in
                var lr: Float = 0
                try check(pock_get_learning_rate(h, &lr))
                return lr
            }
        }
    }

    public func setLearningRate(_ lr: Float) throws {
        try locked { h in try check(pock_set_learning_rate(h, lr)) }
    }

    /// Optimizer steps taken (restored with a checkpoint).
    public var stepCount: Int {
        get throws {
            try locked { h in
                var steps: Int64 = 0
                try check(pock_step_count(h, &steps))
                return Int(steps)
            }
        }
    }

    /// Threads of the trainer's pool (default: all cores).
    public func setNumThreads(_ n: Int) throws {
        try locked { h in try check(pock_set_num_threads(h, Int32(n))) }
    }

    /// Times every node of the training step over `steps` real steps on one batch
    /// (after `warmup` unprofiled ones), as Python's `trainer.profile`.
    public func profile(inputs: [PockTensor], targets: [PockTensor], steps: Int = 20, warmup: Int = 3) throws -> PockProfile {
        guard steps >= 1, warmup >= 0 else {
            throw PockError(.invalidArgument, "profile: steps must be >= 1 and warmup >= 0, got \(steps), \(warmup)")
        }
        for _ in 0..<warmup { _ = try self.step(inputs: inputs, targets: targets) }
        try locked { h in try check(pock_profile_enable(h, 1)) }
        defer { _ = try? locked { h in pock_profile_enable(h, 0) } }
        try locked { h in try check(pock_profile_reset(h)) }
        let start = DispatchTime.now().uptimeNanoseconds
        var losses: [Float] = []
        for _ in 0..<steps { losses.append(try self.step(inputs: inputs, targets: targets)) }
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start)
        let nodes: [PockNodeTime] = try locked { h in
            try (0..<pock_profile_count(h)).map { i in
                var e = pock_node_profile()
                try check(pock_profile_entry(h, i, &e))
                return PockNodeTime(index: Int(e.index), phase: String(cString: e.phase), op: String(cString: e.op),
                                    kernel: String(cString: e.kernel), module: String(cString: e.module), flops: e.flops,
                                    ms: e.steps > 0 ? Double(e.total_ns) / 1e6 / Double(e.steps) : 0)
            }
        }
        return PockProfile(nodes: nodes, steps: steps, stepMs: elapsed / 1e6 / Double(steps), losses: losses)
    }

    /// step(inputs:targets:) off the calling thread: `let loss = try await trainer.stepAsync(...)`.
    public func stepAsync(inputs: [PockTensor], targets: [PockTensor],
                          priority: TaskPriority = .utility) async throws -> Float {
        try await Task.detached(priority: priority) { try self.step(inputs: inputs, targets: targets) }.value
    }

    // MARK: the LLM loop (issue 37)

    /// True when the compiled model is a Llama-family causal LM that `generate` runs.
    public var canGenerate: Bool { pock_generate_supported() != 0 }

    /// The new token ids the model generates after `promptIds` (Python's `trainer.generate`,
    /// Kotlin's `generate`), from the current weights in place with a KV cache.  temperature 0
    /// is greedy; topK 0 and topP 1 are off; the same seed gives the same tokens; a `stop` id ends
    /// generation and is kept.  `onToken` streams: called on this thread with each new token,
    /// returning true stops after it.  It must not call this trainer: its methods throw
    /// PockError(.invalidArgument) there (and close() would wait for the lock generate holds).
    /// Bad arguments throw PockError(.value, ...) naming them (pock_generate's checks).
    public func generate(promptIds: [Int32], maxNewTokens: Int = 32, temperature: Float = 0, topK: Int = 0,
                         topP: Float = 1, seed: UInt64 = 0, stop: [Int32] = [],
                         onToken: ((Int32) -> Bool)? = nil) throws -> [Int32] {
        guard (0...Int(Int32.max)).contains(maxNewTokens), (0...Int(Int32.max)).contains(topK) else {
            throw PockError(.value, "generate: maxNewTokens and topK must be in [0, 2^31), got \(maxNewTokens), \(topK)")
        }
        return try locked { h in
            let prompt = promptIds.map { Int64($0) }, stops = stop.map { Int64($0) }
            // calloc: pages are touched only as ids are written (a huge maxNewTokens is refused by pock_generate)
            let capacity = max(maxNewTokens, 1)
            guard let out = calloc(capacity, MemoryLayout<Int64>.stride)?.assumingMemoryBound(to: Int64.self) else {
                throw PockError(.noMemory, "generate: no memory for maxNewTokens \(maxNewTokens) ids")
            }
            defer { free(out) }
            let sink = onToken.map { TokenSink($0) }
            var opts = pock_generate_options()
            pock_generate_default_options(&opts)
            opts.max_new_tokens = Int32(maxNewTokens)
            opts.temperature = temperature
            opts.top_k = Int32(topK)
            opts.top_p = topP
            opts.seed = seed
            if let sink = sink {
                opts.callback = { (token: Int64, user: UnsafeMutableRawPointer?) -> Int32 in
                    Unmanaged<TokenSink>.fromOpaque(user!).takeUnretainedValue().body(Int32(truncatingIfNeeded: token)) ? 1 : 0
                }
                opts.user_data = Unmanaged.passUnretained(sink).toOpaque()
            }
            var n: Int32 = 0
            Thread.current.threadDictionary[generatingKey] = true
            defer { Thread.current.threadDictionary[generatingKey] = nil }
            let status: pock_status = withExtendedLifetime(sink) {
                prompt.withUnsafeBufferPointer { p -> pock_status in
                    stops.withUnsafeBufferPointer { s -> pock_status in
                        opts.stop_ids = s.baseAddress
                        opts.n_stop = Int32(s.count)
                        return pock_generate(h, p.baseAddress, Int32(p.count), &opts, out, Int32(capacity), &n)
                    }
                }
            }
            try check(status)
            return (0..<Int(n)).map { Int32(truncatingIfNeeded: out[$0]) }
        }
    }

    /// Writes the LoRA adapters to `url` (Python's `export_adapter`): format "peft" makes `url` a
    /// folder of adapter_model.safetensors + adapter_config.json (peft.PeftModel.from_pretrained
    /// loads it), "gguf" a llama.cpp LoRA adapter file.  Written atomically.
    public func exportAdapter(to url: URL, format: String = "peft") throws {
        try locked { h in try check(pock_export_adapter(h, url.path, format)) }
    }

    /// The onToken closure of a generate call, handed to the C callback as user_data.
    private final class TokenSink {
        let body: (Int32) -> Bool
        init(_ body: @escaping (Int32) -> Bool) { self.body = body }
    }

    /// Set in the generating thread's dictionary while generate runs: a call from its onToken
    /// callback is refused instead of deadlocking on the (non-recursive) lock.
    private var generatingKey: String { "ai.pockengine.generating.\(ObjectIdentifier(self).hashValue)" }

    private func dtypeCode(_ name: String) -> Int32 {
        switch name {
        case "i64": return Int32(POCK_I64.rawValue)
        case "i32": return Int32(POCK_I32.rawValue)
        case "u8": return Int32(POCK_U8.rawValue)
        default: return Int32(POCK_F32.rawValue)
        }
    }

    /// Runs body with the live handle under the trainer's lock (PockError(.closed) after close()).
    private func locked<R>(_ body: (OpaquePointer) throws -> R) throws -> R {
        if Thread.current.threadDictionary[generatingKey] != nil {
            throw PockError(.invalidArgument, "called from generate's onToken callback; the trainer is busy generating")
        }
        lock.lock()
        defer { lock.unlock() }
        guard let h = handle else { throw PockError(.closed, "the trainer of '\(manifest.name)' is closed") }
        return try body(h)
    }
}
