import Foundation
import KeyboardShared
import PockKeyboardBase   // pock-build's package: KeyboardBaseModel + PockEngine (PockTrainer)

/// The app's trainer and the shared Kotlin logic (KeyboardShared) around it, in the app
/// group container both the app and the keyboard extension see. The extension predicts
/// and buffers sentences; the app trains in a BGProcessingTask while charging.
final class KeyboardEngine {
    static let batch = 8, seq = 16
    static let group = "group.org.pockengine.keyboard"

    let tokenizer: Tokenizer
    let buffer: TrainingBuffer
    let personalizer: Personalizer
    let ranker: SuggestionRanker
    let checkpoint: URL
    /// The personalized LLM's next words (SmartComposeEngine.swift); nil when its model is not in the app.
    let smartCompose: SmartComposeEngine?
    private let trainer: PockTrainer
    private let lock = NSLock()

    init() throws {
        let dir = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: Self.group)!
        let vocab = try String(contentsOf: Bundle.main.url(forResource: "vocab", withExtension: "txt")!)
        tokenizer = Tokenizer.companion.fromVocabText(text: vocab)
        buffer = TrainingBuffer(store: FileBlobStore(path: dir.appendingPathComponent("typed_sentences.txt").path),
                                maxSentences: 2000, maxChars: 200_000)
        personalizer = Personalizer(tokenizer: tokenizer, buffer: buffer,
                                    policy: TrainingPolicy(batch: Int32(Self.batch), seq: Int32(Self.seq),
                                                           minNewTokens: 200, passes: 2.0, maxSteps: 150),
                                    statsStore: FileBlobStore(path: dir.appendingPathComponent("learning_stats.txt").path))
        checkpoint = dir.appendingPathComponent("user.pockckpt")
        smartCompose = try? SmartComposeEngine(directory: dir)
        trainer = try KeyboardBaseModel.makeTrainer()
        if FileManager.default.fileExists(atPath: checkpoint.path) { try trainer.load(from: checkpoint) }
        let shape = CompiledShape(batch: Int32(Self.batch), seq: Int32(Self.seq), vocab: tokenizer.size)
        ranker = SuggestionRanker(tokenizer: tokenizer, model: Model(trainer: trainer, shape: shape, lock: lock),
                                  maxContext: Int32(Self.seq))
    }

    /// One background session; returns the steps run.
    func train() throws -> Int {
        lock.lock(); defer { lock.unlock() }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let fresh = buffer.untrainedSentences()
        let steps = personalizer.trainIfReady(trainer: Step(trainer: trainer), charging: true, nowMillis: now, seed: now)
        if steps > 0 { try trainer.save(to: checkpoint) }
        if steps > 0 { try smartCompose?.learn(fresh) }   // the same new sentences into the LLM's adapters
        return Int(steps)
    }

    func forget() throws {
        lock.lock(); defer { lock.unlock() }
        personalizer.forget()
        try? FileManager.default.removeItem(at: checkpoint)
        try trainer.load(from: KeyboardBaseModel.bundleURL.appendingPathComponent("weights.pockckpt"))
        try smartCompose?.forget()
    }

    private static func int64s(_ a: KotlinIntArray) -> [Int64] { (0..<a.size).map { Int64(a.get(index: $0)) } }

    /// NextWordModel over PockTrainer.forward (the shared ranker calls it).
    private final class Model: NextWordModel {
        let trainer: PockTrainer, shape: CompiledShape, lock: NSLock
        init(trainer: PockTrainer, shape: CompiledShape, lock: NSLock) { self.trainer = trainer; self.shape = shape; self.lock = lock }
        func nextLogits(context: KotlinIntArray) -> KotlinFloatArray {
            lock.lock(); defer { lock.unlock() }
            let x = PockTensor(KeyboardEngine.int64s(shape.input(context: context)), shape: [KeyboardEngine.batch, KeyboardEngine.seq])
            let out = (try? trainer.forward(inputs: [x]))?.first?.floats ?? []
            let flat = KotlinFloatArray(size: Int32(out.count))
            for (i, v) in out.enumerated() { flat.set(index: Int32(i), value: v) }
            return shape.nextLogits(output: flat, context: context)
        }
    }

    /// StepTrainer over PockTrainer.step.
    private final class Step: StepTrainer {
        let trainer: PockTrainer
        init(trainer: PockTrainer) { self.trainer = trainer }
        func step(x: KotlinIntArray, y: KotlinIntArray) -> Float {
            let shape = [KeyboardEngine.batch, KeyboardEngine.seq]
            return (try? trainer.step(inputs: [PockTensor(KeyboardEngine.int64s(x), shape: shape)],
                                      targets: [PockTensor(KeyboardEngine.int64s(y), shape: shape)])) ?? .nan
        }
    }
}
