import org.jetbrains.kotlin.gradle.dsl.JvmTarget

plugins {
    alias(libs.plugins.android.application)
    alias(libs.plugins.kotlin.android)
}

android {
    namespace = "org.edgevit.demo"
    // compileSdk/targetSdk 36 (Android 16): Google Play requires new apps and
    // updates to target the latest API level within a year of its release.
    compileSdk = 36

    defaultConfig {
        applicationId = "org.edgevit.demo"
        // minSdk 24 (Android 7.0): CameraX 1.4 and LiteRT's Interpreter line run
        // there, and it is the floor of LiteRT's 2.x AARs (a later move to
        // CompiledModel keeps the same devices). NNAPI needs 27: below it the
        // app falls back to the CPU and says so.
        minSdk = 24
        targetSdk = 36
        versionCode = 1
        versionName = "0.1.0"
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    androidResources {
        // Keep the model uncompressed in the APK (smaller install-time work,
        // and memory-mappable should the app switch to mapping it).
        noCompress += "tflite"
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(JvmTarget.JVM_17)
    }
}

dependencies {
    implementation(libs.litert)
    implementation(libs.litert.gpu)
    implementation(libs.litert.gpu.api)
    implementation(libs.camerax.core)
    implementation(libs.camerax.camera2)
    implementation(libs.camerax.lifecycle)
    implementation(libs.camerax.view)
    implementation(libs.androidx.activity)
    testImplementation(libs.junit)
}
