import BackgroundTasks
import SwiftUI

/// The containing app: settings (how much the keyboard learned, forget) and the
/// background training task, which iOS runs while the phone charges.
@main
struct PockKeyboardApp: App {
    static let task = "org.pockengine.keyboard.personalize"
    static let engine = try? KeyboardEngine()

    init() {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: Self.task, using: nil) { task in
            Self.schedule()
            let work = Task.detached { _ = try? Self.engine?.train() }
            task.expirationHandler = { work.cancel() }
            Task { await work.value; task.setTaskCompleted(success: true) }
        }
        Self.schedule()
    }

    static func schedule() {
        let request = BGProcessingTaskRequest(identifier: task)
        request.requiresExternalPower = true          // train only while charging
        request.requiresNetworkConnectivity = false   // nothing leaves the phone
        try? BGTaskScheduler.shared.submit(request)
    }

    var body: some Scene { WindowGroup { SettingsView(engine: Self.engine) } }
}

struct SettingsView: View {
    let engine: KeyboardEngine?
    @State private var refresh = 0

    var body: some View {
        let stats = engine?.personalizer.stats
        NavigationStack {
            List {
                Section("Learned on this iPhone only") {
                    LabeledContent("Training steps", value: "\(stats?.steps ?? 0)")
                    LabeledContent("Last loss", value: stats.map { $0.lastLoss.isNaN ? "-" : String(format: "%.2f", $0.lastLoss) } ?? "-")
                    LabeledContent("Last personalized", value: lastTime(stats?.lastTrainedMillis ?? 0))
                    LabeledContent("Sentences learned", value: "\(stats?.sentencesLearned ?? 0)")
                    LabeledContent("Sentences waiting", value: "\(engine?.buffer.untrained ?? 0)")
                }
                Section {
                    Button("Forget what I typed", role: .destructive) { try? engine?.forget(); refresh += 1 }
                }
                Section("Enable") {
                    Text("Settings → General → Keyboard → Keyboards → Add New Keyboard → Pock Keyboard, then allow Full Access (needed to keep typed sentences for training).")
                        .font(.footnote)
                }
            }
            .id(refresh)
            .navigationTitle("Pock Keyboard")
        }
    }

    private func lastTime(_ millis: Int64) -> String {
        millis == 0 ? "never" : Date(timeIntervalSince1970: Double(millis) / 1000).formatted()
    }
}
