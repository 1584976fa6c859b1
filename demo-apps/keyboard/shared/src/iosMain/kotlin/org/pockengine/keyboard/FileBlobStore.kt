package org.pockengine.keyboard

import kotlinx.cinterop.BetaInteropApi
import kotlinx.cinterop.ExperimentalForeignApi
import platform.Foundation.NSFileManager
import platform.Foundation.NSString
import platform.Foundation.NSUTF8StringEncoding
import platform.Foundation.create
import platform.Foundation.stringWithContentsOfFile
import platform.Foundation.writeToFile

/** A [BlobStore] in one file of the app group container (shared by app and keyboard extension).
 *  Not compiled here (needs Kotlin/Native on macOS): the Gradle build in shared/ does. */
@OptIn(ExperimentalForeignApi::class, BetaInteropApi::class)
class FileBlobStore(private val path: String) : BlobStore {
    override fun read(): String? = NSString.stringWithContentsOfFile(path, NSUTF8StringEncoding, null)

    override fun write(text: String) {
        check(NSString.create(string = text).writeToFile(path, atomically = true, encoding = NSUTF8StringEncoding, error = null)) {
            "cannot write $path"
        }
    }

    override fun delete() {
        NSFileManager.defaultManager.removeItemAtPath(path, null)
    }
}
