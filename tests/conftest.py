"""Test setup: 8 simulated CPU devices (set before JAX starts) and small shared fixtures."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dysejax.runtime import simulate_host_devices  # noqa: E402  (imports no JAX)


def _jaxlib_knows(flag: str) -> bool:
    """Whether the installed jaxlib's binaries name `flag` (XLA aborts on an unknown XLA_FLAGS
    entry; reads the files, imports no JAX)."""
    import glob
    import importlib.util
    import mmap

    spec = importlib.util.find_spec("jaxlib")
    if spec is None or spec.origin is None:
        return False
    for path in sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.so")), key=os.path.getsize, reverse=True):
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(flag.encode()) >= 0:
                return True
    return False


# Tests compile hundreds of small programs and run each for a few steps. Two XLA:CPU settings
# cut compile time and change no result beyond the tests' tolerances: LLVM's optimisation level 0
# (about a third less), and XLA's older fusion emitters instead of the MLIR ones (a tiny 8-device
# train step: 16 -> 6 CPU-seconds; the same loss, byte figures within 0.01%). Subprocesses
# inherit them. Benchmarks and users keep XLA's defaults.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
for _flag in TEST_XLA_FLAGS:
    _name = _flag.split("=")[0]
    if _name not in os.environ.get("XLA_FLAGS", "") and _jaxlib_knows(_name.lstrip("-")):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
simulate_host_devices(8)


def compile_flags() -> str:
    """The TEST_XLA_FLAGS in force, for a child process that must set up its devices and XLA:CPU
    workarounds by itself (as a user's run does) but compile as fast as the tests."""
    names = {f.split("=")[0] for f in TEST_XLA_FLAGS}
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] in names)

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# dysejax's user cache (cost-model calibrations) for this session only: tests neither read a
# calibration another run left in ~/.cache nor leave theirs there (subprocesses inherit it).
os.environ["DYSEJAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="dysejax-tests-cache-")
atexit.register(shutil.rmtree, os.environ["DYSEJAX_CACHE_DIR"], True)

TINY = os.path.join(ROOT, "configs", "tiny.yaml")

# Small, fast settings shared by trainer tests: two buckets, a few hundred documents, byte
# tokens (tests of the trained BPE use it explicitly).
FAST = ["data.tokenizer=bytes", "model.vocab_size=264", "data.buckets=[64,128]", "data.tokens_per_batch=1024", "data.max_docs=300",
        "data.eval_batches=1", "train.progress=false", "model.d_model=64", "model.d_ff=128"]


@pytest.fixture
def tiny_config():
    """The tiny config with FAST overrides plus any extra `key=value` strings."""
    import dysejax

    def make(*extra):
        return dysejax.load_config(TINY, FAST + list(extra))
    return make


# --------------------------------------------------------------------------------------------
# Test files in order of their measured seconds, longest first (`--dist loadfile` keeps a file in
# one worker: started last, a long file leaves the other workers idle at the end). The seconds
# are those of the last run recorded with `--record-file-seconds tests/file_seconds.json`, kept
# per marker expression (the default suite and `-m slow` differ); a file not recorded yet goes
# first, and without the table files keep their collection order.
# --------------------------------------------------------------------------------------------
FILE_SECONDS = os.path.join(ROOT, "tests", "file_seconds.json")
_recorded: dict = {}


def pytest_addoption(parser):
    parser.addoption("--record-file-seconds", metavar="PATH",
                     help="write each test file's seconds (setup + call + teardown) to this JSON, under the "
                          "-m expression; tests/file_seconds.json orders the files of later runs")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _read_table(path: str) -> dict:
    import json
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # pytest-xdist: keep the collection order below


def pytest_collection_modifyitems(config, items):
    seconds = _read_table(FILE_SECONDS).get(config.option.markexpr, {})
    first_seen: dict = {}
    for item in items:
        first_seen.setdefault(_file_of(item.nodeid), len(first_seen))
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), float("inf")), first_seen[_file_of(item.nodeid)]))


def pytest_runtest_logreport(report):
    name = _file_of(report.nodeid)
    _recorded[name] = _recorded.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--record-file-seconds")
    if not path or hasattr(session.config, "workerinput"):  # written once, by the controller
        return
    import json
    table = _read_table(path)
    table[session.config.option.markexpr] = {k: round(v, 1) for k, v in _recorded.items()}
    with open(path, "w") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
        fh.write("\n")
