plugins {
    id("com.android.application")
    kotlin("android")
}

android {
    namespace = "org.pockengine.keyboard.app"
    compileSdk = 34
    defaultConfig {
        applicationId = "org.pockengine.keyboard"
        minSdk = 26
        targetSdk = 34
        versionCode = 1
        versionName = "0.1"
        ndk { abiFilters += "arm64-v8a" }   // the AAR carries arm64 natives
    }
    kotlinOptions { jvmTarget = "17" }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    // vocab.txt ships as an asset, straight from the model folder
    sourceSets["main"].assets.srcDir(layout.buildDirectory.dir("generated/vocab"))
}

val copyVocab by tasks.registering(Copy::class) {
    from("../../model/vocab.txt")
    into(layout.buildDirectory.dir("generated/vocab"))
}
tasks.named("preBuild") { dependsOn(copyVocab) }

dependencies {
    implementation(project(":shared"))
    // PockTrainer + libpock_keyboard_base.so + the model bundle, from pock-build --platform android
    implementation(files("libs/pockengine-keyboard_base.aar"))
    implementation("androidx.work:work-runtime-ktx:2.9.1")
}
