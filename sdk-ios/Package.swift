// swift-tools-version:5.7
// PockEngine's Swift layer over the C API (pock.h).  An app normally adds the
// package that `pock-build SPEC --platform ios` writes: it holds these sources,
// the model's XCFramework (the symbols of pock.h) and the model bundle.
import PackageDescription

let package = Package(
    name: "PockEngine",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [.library(name: "PockEngine", targets: ["PockEngine"])],
    targets: [
        .systemLibrary(name: "PockC", path: "Sources/PockC"),
        .target(name: "PockEngine", dependencies: ["PockC"], path: "Sources/PockEngine",
                linkerSettings: [.linkedLibrary("c++"), .linkedFramework("CoreML")]),
    ]
)
