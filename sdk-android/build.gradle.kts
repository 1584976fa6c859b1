// PockEngine's Android library: the Kotlin API (src/main/kotlin, no android.*), the Android
// helpers (src/android/kotlin: assets, WorkManager) and the model's native library built by
// CMake from pock-build's generated C++ + PockEngine's runtime + src/main/cpp/pock_jni.cpp.
//
// Written for AGP 8.x / Kotlin 2.x.  pock-build --platform android produces the same AAR without
// Gradle (its classes.jar holds the core API only); this module is for Android Studio users.
import org.jetbrains.kotlin.gradle.dsl.JvmTarget

plugins {
    id("com.android.library") version "8.7.3"
    id("org.jetbrains.kotlin.android") version "2.2.0"
}

val pockModelDir: File = file(providers.gradleProperty("pock.modelDir").getOrElse("../pock-out/keyboard"))
val pockModel: String = providers.gradleProperty("pock.model").getOrElse("keyboard")
val pockMarch: String = providers.gradleProperty("pock.march").getOrElse("armv8.2-a+dotprod+fp16")
val pockRuntime: File = file("../native/runtime")

android {
    namespace = "ai.pockengine"
    compileSdk = 35
    ndkVersion = "27.2.12479018"

    defaultConfig {
        minSdk = 24
        consumerProguardFiles("consumer-rules.pro")
        ndk {
            abiFilters += listOf("arm64-v8a", "x86_64") // x86_64: the emulator; add "armeabi-v7a" for old phones
        }
        externalNativeBuild {
            cmake {
                arguments += listOf(
                    "-DPOCK_RUNTIME=${pockRuntime.absolutePath}",
                    "-DPOCK_MODEL_CPP=${pockModelDir.resolve("$pockModel.cpp").absolutePath}",
                    "-DPOCK_MODEL_NAME=$pockModel",
                    "-DPOCK_MARCH=$pockMarch",
                    "-DANDROID_STL=c++_static",
                )
            }
        }
    }

    externalNativeBuild {
        cmake {
            path = file("src/main/cpp/CMakeLists.txt")
            version = "3.22.1"
        }
    }

    sourceSets {
        getByName("main") {
            // core API + the Android-only helpers (a separate folder so the core compiles on a plain JVM)
            kotlin.srcDirs("src/main/kotlin", "src/android/kotlin")
            assets.srcDir(layout.buildDirectory.dir("generated/pockAssets"))
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_1_8
        targetCompatibility = JavaVersion.VERSION_1_8
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(JvmTarget.JVM_1_8)
    }
}

// The model bundle (model.json + weights) goes to assets/pockengine/<name>/, where PockAssets finds it.
val copyPockBundle by tasks.registering(Copy::class) {
    from(pockModelDir.resolve("bundle"))
    into(layout.buildDirectory.dir("generated/pockAssets/pockengine/$pockModel"))
}
tasks.named("preBuild") { dependsOn(copyPockBundle) }

dependencies {
    // PockTrainer.train checks coroutine cancellation between steps (the POM pock-build writes declares it too).
    implementation("org.jetbrains.kotlinx:kotlinx-coroutines-core:1.8.0")
    // Only PockTrainingWorker needs WorkManager; apps that use it add work-runtime themselves.
    compileOnly("androidx.work:work-runtime:2.9.1")
    // Only QnnPrefixRunner needs ONNX Runtime with the QNN EP (bundles built with --backends htp,cpu).
    compileOnly("com.microsoft.onnxruntime:onnxruntime-android-qnn:1.22.0")
}
