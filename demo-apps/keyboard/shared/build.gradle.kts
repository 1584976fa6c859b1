// The keyboard's shared logic as a Kotlin Multiplatform module: jvm/android (the Android
// app, and the JVM tests run here with kotlinc) and an iOS framework `KeyboardShared`
// (the iOS app and its keyboard extension). Built by ../android's Gradle build, or for iOS:
//   ./gradlew :shared:assembleKeyboardSharedXCFramework   (on macOS)
plugins {
    kotlin("multiplatform")
}

kotlin {
    jvmToolchain(17)
    jvm()
    val xcf = org.jetbrains.kotlin.gradle.plugin.mpp.apple.XCFramework("KeyboardShared")
    listOf(iosArm64(), iosSimulatorArm64()).forEach {
        it.binaries.framework {
            baseName = "KeyboardShared"
            xcf.add(this)
        }
    }
}
