// The keyboard demo app. Open this folder in Android Studio (Koala or newer, JDK 17).
// Before the first build, compile the model bundle (see ../README.md):
//   pock-build demo-apps/keyboard/model/spec.py:make_base --platform android --soc sm8550 --out out/keyboard-android
//   cp out/keyboard-android/pockengine-keyboard_base.aar demo-apps/keyboard/android/app/libs/
pluginManagement {
    repositories { google(); mavenCentral(); gradlePluginPortal() }
}
dependencyResolutionManagement {
    repositories { google(); mavenCentral() }
}
rootProject.name = "PockKeyboard"
include(":app", ":shared")
project(":shared").projectDir = file("../shared")
