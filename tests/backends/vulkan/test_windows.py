"""Steps needing more device memory than one storage-buffer binding covers: the
shaders see the one buffer through several windows (POCK_VK_MAX_BUFFER_BYTES
forces a small binding here), and match the CPU after 5 steps."""
import numpy as np
import pytest
import torch

import pockengine as pe
from models import MODELS, batches
from pockengine.backends.vulkan import plan_windows
from vk_helpers import needs_vulkan


def test_plan_windows_keeps_every_tensor_inside_one():
    ext = [(0, 64, "scalars"), (256, 900, "a"), (800, 1500, "b"), (1600, 1700, "c"), (1700, 2400, "d")]
    windows, of = plan_windows(ext, 2400, 1024)
    assert windows[0][0] == 0 and all(s % 256 == 0 and n <= 1024 for s, n in windows)
    for a, b, _ in ext:
        s, n = windows[of[(a, b)]]
        assert s <= a and b <= s + n
    assert plan_windows(ext, 2400, 4096) == ([(0, 2400)], {(a, b): 0 for a, b, _ in ext})
    with pytest.raises(pe.PockError, match=r"tensor 'd' \(700 bytes\).*800 bytes"):
        plan_windows(ext, 2400, 800)


@needs_vulkan
@pytest.mark.parametrize("name,limit", [("mlp", 8192), ("cnn", 65536)])
def test_split_device_memory_matches_cpu(name, limit, monkeypatch):
    torch.manual_seed(0)
    data = batches(name)
    prog = pe.compile(MODELS[name]().train(), *data[0], optimizer=pe.SGD(lr=0.05, momentum=0.9))
    cpu = prog.build(backends=["cpu"])
    monkeypatch.setenv("POCK_VK_MAX_BUFFER_BYTES", str(limit))
    vk = prog.build(backends=["vulkan", "cpu"])
    for i in range(5):
        np.testing.assert_allclose(vk.step(*data[i % 3]), cpu.step(*data[i % 3]), rtol=1e-4, atol=1e-6)
    got, want = vk.state_dict(), cpu.state_dict()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
