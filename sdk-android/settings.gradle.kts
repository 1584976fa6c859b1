// PockEngine's Android SDK as a standalone Gradle build (open this folder in Android Studio),
// or include it from an app's settings.gradle.kts:  include(":pockengine"); project(":pockengine").projectDir = file("path/to/sdk-android")
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "pockengine"
