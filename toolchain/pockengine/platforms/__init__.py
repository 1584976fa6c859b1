"""Device targets of pock-build: one module per platform.

    android.py  build_android(prog, out, ...) -> AAR
    ios.py      build_ios(prog, out, ...)     -> XCFramework + Swift package
    socs.py     the SoC table (--soc)
"""
