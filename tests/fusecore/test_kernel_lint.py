"""fusecore.kernel_lint: acquiring atomics whose value nobody reads."""

from pathlib import Path

from fusecore.kernel_lint import check_paths, unused_acquires

BAD = '''
def wait(count_ptr, target):
    seen = 0
    while seen < target:
        tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        seen = tl.load(count_ptr, volatile=True)

def wait_named(count_ptr):
    unused = tl.atomic_or(count_ptr, 0, sem="acq_rel")
    return 1
'''

GOOD = '''
def wait(count_ptr, target):
    seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")

def signal(count_ptr):
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")  # a release writes: its result may go unused
    tl.atomic_xchg(count_ptr, 0, sem="relaxed")
    last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == 3
    return last
'''


def test_finds_discarded_and_unread_acquires():
    found = unused_acquires(BAD, "bad.py")
    assert [(f.function, f.call, f.line) for f in found] == [("wait", "atomic_add", 5), ("wait_named", "atomic_or", 9)]
    assert "bad.py:5" in str(found[0]) and "use its value" in str(found[0])
    assert unused_acquires(GOOD) == []


def test_the_project_kernels_have_no_unused_acquire():
    root = Path(__file__).resolve().parents[2]
    packages = [root / name for name in ("fusecore", "gnnfuse", "simfuse", "llmfuse")]
    assert [str(f) for f in check_paths(packages)] == []
