import Foundation
import PockC

/// Text <-> token ids with the runtime's tokenizer (pock.h `pock_tokenizer_*`): the same ids
/// as Hugging Face `tokenizers`, Python's `pe.Tokenizer` and Kotlin's `PockTokenizer`, from a
/// tokenizer.json, a folder holding one, or a GGUF file.  The tokenizer lives in every model
/// library (the XCFramework), so it needs no trainer.  Calls are serialised on the tokenizer,
/// so one may be shared between threads; errors throw `PockError`.
public final class PockTokenizer {
    private var handle: OpaquePointer?
    private let lock = NSLock()

    /// Tokens in the vocabulary (added tokens included).
    public let vocabSize: Int
    public let bosId: Int?
    public let eosId: Int?
    public let padId: Int?

    /// From a tokenizer.json, a folder holding one (and tokenizer_config.json), or a .gguf file.
    public convenience init(contentsOf url: URL) throws {
        var opened: OpaquePointer?
        try check(pock_tokenizer_open(url.path, &opened))
        try self.init(handle: opened!)
    }

    /// From the bytes of a tokenizer.json or a GGUF file (e.g. a bundled resource).
    public convenience init(data: Data) throws {
        var opened: OpaquePointer?
        try data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            try check(pock_tokenizer_open_memory(raw.baseAddress, Int64(raw.count), &opened))
        }
        try self.init(handle: opened!)
    }

    private init(handle: OpaquePointer) throws {
        var size: Int32 = 0, bos: Int32 = -1, eos: Int32 = -1, pad: Int32 = -1
        do {
            try check(pock_tokenizer_vocab_size(handle, &size))
            try check(pock_tokenizer_special_ids(handle, &bos, &eos, &pad))
        } catch {
            pock_tokenizer_close(handle)
            throw error
        }
        self.handle = handle
        vocabSize = Int(size)
        bosId = bos >= 0 ? Int(bos) : nil
        eosId = eos >= 0 ? Int(eos) : nil
        padId = pad >= 0 ? Int(pad) : nil
    }

    deinit {
        pock_tokenizer_close(handle)
    }

    /// Token ids of `text`; `addSpecialTokens`: the tokenizer's own (e.g. Llama's BOS), as Hugging Face does.
    public func encode(_ text: String, addSpecialTokens: Bool = true) throws -> [Int32] {
        try locked("encode") { h in
            let utf8 = Array(text.utf8)
            var ids: UnsafePointer<Int32>?
            var count: Int64 = 0
            try utf8.withUnsafeBufferPointer { buf in
                try buf.withMemoryRebound(to: CChar.self) { chars in
                    try check(pock_tokenizer_encode(h, chars.baseAddress, Int64(chars.count), addSpecialTokens ? 1 : 0,
                                                    &ids, &count))
                }
            }
            guard let ids = ids, count > 0 else { return [] }
            return Array(UnsafeBufferPointer(start: ids, count: Int(count)))
        }
    }

    /// Text of `ids`; an id outside the vocabulary throws `PockError` (`.value`) naming it.
    public func decode(_ ids: [Int32], skipSpecialTokens: Bool = false) throws -> String {
        try locked("decode") { h in
            var text: UnsafePointer<CChar>?
            var nbytes: Int64 = 0
            try ids.withUnsafeBufferPointer { buf in
                try check(pock_tokenizer_decode(h, buf.baseAddress, Int64(buf.count), skipSpecialTokens ? 1 : 0,
                                                &text, &nbytes))
            }
            guard let text = text, nbytes > 0 else { return "" }
            let bytes = UnsafeRawBufferPointer(start: text, count: Int(nbytes))
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    /// The id of `token`, or nil when it is not in the vocabulary.
    public func tokenToId(_ token: String) throws -> Int? {
        try locked("tokenToId") { h in
            let utf8 = Array(token.utf8)
            var id: Int32 = -1
            try utf8.withUnsafeBufferPointer { buf in
                try buf.withMemoryRebound(to: CChar.self) { chars in
                    try check(pock_tokenizer_token_to_id(h, chars.baseAddress, Int64(chars.count), &id))
                }
            }
            return id >= 0 ? Int(id) : nil
        }
    }

    /// Frees the tokenizer now (deinit does it otherwise); later calls throw `.closed`.
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        pock_tokenizer_close(handle)
        handle = nil
    }

    private func locked<T>(_ what: String, _ body: (OpaquePointer) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        guard let h = handle else { throw PockError(.closed, "\(what): the tokenizer is closed") }
        return try body(h)
    }
}
