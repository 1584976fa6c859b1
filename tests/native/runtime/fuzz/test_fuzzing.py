"""fuzzing.spawn_small: a fuzzer's RSS limit reads its own peak, not the peak of the pytest worker
that started it (Linux keeps ru_maxrss across execve; CI's fuzzers once read 3082 MB at their
first input, inherited from a worker that had held a large model)."""
import subprocess
import sys

from fuzzing import spawn_small

PEAK = 'import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)'
PARENT = f'''
import subprocess, sys
from fuzzing import spawn_small
held = bytearray(400 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
direct = subprocess.run([sys.executable, "-c", {PEAK!r}], capture_output=True, text=True, check=True)
small = subprocess.run(spawn_small([sys.executable, "-c", {PEAK!r}]), capture_output=True, text=True, check=True)
print(direct.stdout.strip(), small.stdout.strip())
'''


def test_spawned_process_reads_its_own_peak_rss():
    import fuzzing
    r = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, check=True,
                       env={"PYTHONPATH": str(fuzzing.HERE)})
    direct_mb, small_mb = map(int, r.stdout.split())
    assert direct_mb >= 400, (direct_mb, "a direct exec no longer inherits the peak: the test lost its point")
    assert small_mb < 200, (small_mb, "the spawned process read its parent's peak RSS")


def test_spawn_small_passes_arguments_and_exit_status():
    r = subprocess.run(spawn_small([sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)",
                                    "a b", "$HOME", ""]), capture_output=True, text=True)
    assert r.returncode == 3
    assert r.stdout.strip() == "['a b', '$HOME', '']"
