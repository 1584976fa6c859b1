import UIKit

/// The keyboard extension: keys, two three-word suggestion strips (smart compose's LLM words,
/// computed off the main thread, above the shared ranker's), and finished sentences into the
/// training buffer (never from secure text fields). It does not train: extensions have tight
/// memory limits; the app trains in the background.
final class KeyboardViewController: UIInputViewController {
    private let engine = try? KeyboardEngine()
    private var strip: [UIButton] = []
    private var composeStrip: [UIButton] = []
    private let composer = DispatchQueue(label: "org.pockengine.keyboard.smart-compose")
    private var composeFor = ""

    override func viewDidLoad() {
        super.viewDidLoad()
        let rows = UIStackView()
        rows.axis = .vertical
        rows.distribution = .fillEqually
        composeStrip = (0..<3).map { _ in button("") { [weak self] b in self?.pick(b.currentTitle ?? "") } }
        rows.addArrangedSubview(row(composeStrip))
        strip = (0..<3).map { _ in button("") { [weak self] b in self?.pick(b.currentTitle ?? "") } }
        rows.addArrangedSubview(row(strip))
        for keys in ["qwertyuiop", "asdfghjkl'", "zxcvbnm,.?"] {
            rows.addArrangedSubview(row(keys.map { c in button(String(c)) { [weak self] _ in self?.type(String(c)) } }))
        }
        rows.addArrangedSubview(row([
            button("🌐") { [weak self] _ in self?.advanceToNextInputMode() },
            button("space") { [weak self] _ in self?.type(" ") },
            button("⌫") { [weak self] _ in self?.textDocumentProxy.deleteBackward(); self?.refresh() },
            button("⏎") { [weak self] _ in self?.endSentence(); self?.type("\n") },
        ]))
        rows.translatesAutoresizingMaskIntoConstraints = false
        view.addSubview(rows)
        NSLayoutConstraint.activate([
            rows.leadingAnchor.constraint(equalTo: view.leadingAnchor), rows.trailingAnchor.constraint(equalTo: view.trailingAnchor),
            rows.topAnchor.constraint(equalTo: view.topAnchor), rows.bottomAnchor.constraint(equalTo: view.bottomAnchor),
            rows.heightAnchor.constraint(equalToConstant: 260),
        ])
    }

    private func row(_ views: [UIView]) -> UIStackView {
        let s = UIStackView(arrangedSubviews: views)
        s.distribution = .fillEqually
        return s
    }

    private func button(_ title: String, _ action: @escaping (UIButton) -> Void) -> UIButton {
        UIButton(type: .system, primaryAction: UIAction(title: title) { a in action(a.sender as! UIButton) })
    }

    private func type(_ s: String) {
        textDocumentProxy.insertText(s)
        if s == "." || s == "?" { endSentence() }
        refresh()
    }

    private func pick(_ word: String) {
        guard !word.isEmpty else { return }
        let before = textDocumentProxy.documentContextBeforeInput ?? ""
        let partial = before.reversed().prefix { $0.isLetter || $0 == "'" || $0 == "’" }.count
        for _ in 0..<partial { textDocumentProxy.deleteBackward() }
        textDocumentProxy.insertText(word + " ")
        refresh()
    }

    private func refresh() {
        let before = (textDocumentProxy.documentContextBeforeInput ?? "").components(separatedBy: "\n").last ?? ""
        let words = engine?.ranker.suggest(textBeforeCursor: before, k: 3) ?? []
        for (i, b) in strip.enumerated() { b.setTitle(i < words.count ? words[i] : "", for: .normal) }
        // smart compose: generation takes longer than a key press, so off the main thread, newest text only
        composeFor = before
        guard let compose = engine?.smartCompose else { return }
        composer.async { [weak self] in
            guard DispatchQueue.main.sync(execute: { self?.composeFor == before }) else { return }
            let more = compose.suggest(before)
            DispatchQueue.main.async {
                guard let self = self, self.composeFor == before else { return }
                for (i, b) in self.composeStrip.enumerated() { b.setTitle(i < more.count ? more[i] : "", for: .normal) }
            }
        }
    }

    private func endSentence() {
        guard textDocumentProxy.isSecureTextEntry != true, hasFullAccess,
              let before = textDocumentProxy.documentContextBeforeInput else { return }
        let sentence = before.components(separatedBy: CharacterSet(charactersIn: ".!?\n")).last { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
        if let s = sentence { engine?.buffer.add(sentence: s) }
    }
}
