import Foundation
import KeyboardShared
import PockSmartCompose   // pock-build spec.py:make_smart_compose --platform ios: SmartComposeModel (SmolLM2 + LoRA)

/// Smart compose: the shared Kotlin SmartCompose (KeyboardShared, the same rules as the Android
/// input method's) over the Swift SDK, the same SDK calls as Kotlin's PockLanguageModel.kt:
/// PockTokenizer.encode/decode, PockTrainer.forward/step at the compiled 1 x seq shape,
/// PockTrainer.generate (greedy, the onToken streaming stop) and exportAdapter(to:format:).
/// The extension suggests; the app learns the typed sentences in its background task.
final class SmartComposeEngine {
    let compose: SmartCompose
    let checkpoint: URL
    private let trainer: PockTrainer
    private let lock = NSLock()

    init(directory: URL) throws {
        trainer = try SmartComposeModel.makeTrainer()
        checkpoint = directory.appendingPathComponent("smart_compose.pockckpt")
        if FileManager.default.fileExists(atPath: checkpoint.path) { try trainer.load(from: checkpoint) }
        let tokenizer = try PockTokenizer(contentsOf: SmartComposeModel.bundleURL.appendingPathComponent("tokenizer.json"))
        let seq = trainer.manifest.inputs[0].shape[1]
        let shape = CompiledShape(batch: 1, seq: Int32(seq), vocab: Int32(tokenizer.vocabSize))
        let lm = Model(trainer: trainer, tokenizer: tokenizer, shape: shape, lock: lock)
        compose = SmartCompose(tokenizer: lm, model: lm, seq: Int32(seq), candidates: 200, maxWordTokens: 4)
    }

    /// The strip's words for the text before the cursor (whole words, best first).
    func suggest(_ textBeforeCursor: String) -> [String] {
        compose.suggest(textBeforeCursor: textBeforeCursor, k: 3)
    }

    /// The app's background session: the new sentences into the LoRA adapters, then saved.
    func learn(_ sentences: [String]) throws {
        for s in sentences { _ = compose.learn(sentence: s) }
        _ = compose.flush()
        lock.lock(); defer { lock.unlock() }
        try trainer.save(to: checkpoint, trainedOnly: true)
    }

    /// adapter_model.safetensors + adapter_config.json (peft.PeftModel.from_pretrained loads them).
    func exportAdapter(to url: URL) throws {
        lock.lock(); defer { lock.unlock() }
        try trainer.exportAdapter(to: url, format: "peft")
    }

    func forget() throws {
        lock.lock(); defer { lock.unlock() }
        try? FileManager.default.removeItem(at: checkpoint)
        try trainer.load(from: SmartComposeModel.bundleURL.appendingPathComponent("weights.pockckpt"))
    }

    private static func ints(_ a: KotlinIntArray) -> [Int32] { (0..<a.size).map { a.get(index: $0) } }

    private static func kotlin(_ a: [Int32]) -> KotlinIntArray {
        let out = KotlinIntArray(size: Int32(a.count))
        for (i, v) in a.enumerated() { out.set(index: Int32(i), value: v) }
        return out
    }

    /// TextTokenizer + LanguageModel (the shared SmartCompose calls them) over the SDK.
    private final class Model: TextTokenizer, LanguageModel {
        let trainer: PockTrainer, tokenizer: PockTokenizer, shape: CompiledShape, lock: NSLock
        init(trainer: PockTrainer, tokenizer: PockTokenizer, shape: CompiledShape, lock: NSLock) {
            self.trainer = trainer; self.tokenizer = tokenizer; self.shape = shape; self.lock = lock
        }

        func encode(text: String) -> KotlinIntArray {
            SmartComposeEngine.kotlin((try? tokenizer.encode(text, addSpecialTokens: false)) ?? [])
        }

        func decode(ids: KotlinIntArray) -> String { (try? tokenizer.decode(SmartComposeEngine.ints(ids))) ?? "" }

        func nextLogits(context: KotlinIntArray) -> KotlinFloatArray {
            lock.lock(); defer { lock.unlock() }
            let x = PockTensor(SmartComposeEngine.ints(shape.input(context: context)).map { Int64($0) }, shape: [1, Int(shape.seq)])
            let out = (try? trainer.forward(inputs: [x]))?.first?.floats ?? []
            let flat = KotlinFloatArray(size: Int32(out.count))
            for (i, v) in out.enumerated() { flat.set(index: Int32(i), value: v) }
            return shape.nextLogits(output: flat, context: context)
        }

        func step(x: KotlinIntArray, y: KotlinIntArray) -> Float {
            lock.lock(); defer { lock.unlock() }
            let dims = [1, Int(shape.seq)]
            let ids = { (a: KotlinIntArray) in PockTensor(SmartComposeEngine.ints(a).map { Int64($0) }, shape: dims) }
            return (try? trainer.step(inputs: [ids(x)], targets: [ids(y)])) ?? .nan
        }

        func generate(prompt: KotlinIntArray, maxNewTokens: Int32, onToken: @escaping (KotlinInt) -> KotlinBoolean) -> KotlinIntArray {
            lock.lock(); defer { lock.unlock() }
            let new = (try? trainer.generate(promptIds: SmartComposeEngine.ints(prompt), maxNewTokens: Int(maxNewTokens),
                                             onToken: { (t: Int32) -> Bool in onToken(KotlinInt(int: t)).boolValue })) ?? []
            return SmartComposeEngine.kotlin(new)
        }

        func exportAdapter(path: String, format: String) {
            lock.lock(); defer { lock.unlock() }
            try? trainer.exportAdapter(to: URL(fileURLWithPath: path), format: format)
        }
    }
}
