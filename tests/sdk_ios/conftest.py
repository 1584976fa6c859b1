"""One small model built for iOS once per test session (objects are cached by
content hash under $POCK_CACHE_DIR/ios, so a second session only reassembles)."""
import pytest

import pockengine as pe
from ios_models import tiny_spec


@pytest.fixture(scope="session")
def ios_build(tmp_path_factory):
    from pockengine.platforms.ios import build_ios
    spec = tiny_spec()
    prog = pe.compile(**spec)
    out = tmp_path_factory.mktemp("ios")
    files = build_ios(prog, out, spec=spec)
    return {"prog": prog, "spec": spec, "out": out, **files}
