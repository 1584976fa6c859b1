package org.pockengine.keyboard

import java.io.File
import java.io.FileOutputStream

/** A [BlobStore] in one file (Android: under Context.filesDir, never backed up). */
class FileBlobStore(private val file: File) : BlobStore {
    override fun read(): String? = if (file.exists()) file.readText(Charsets.UTF_8) else null

    override fun write(text: String) {
        file.parentFile?.mkdirs()
        val tmp = File(file.path + ".tmp")
        FileOutputStream(tmp).use { out ->
            out.write(text.toByteArray(Charsets.UTF_8))
            out.fd.sync()
        }
        if (!tmp.renameTo(file)) throw java.io.IOException("cannot replace $file")
    }

    override fun delete() {
        File(file.path + ".tmp").delete()
        if (file.exists() && !file.delete()) throw java.io.IOException("cannot delete $file")
    }
}
