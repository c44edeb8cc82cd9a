"""Test setup: 8 simulated CPU devices (set before JAX starts) and small shared fixtures."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dysejax.runtime import simulate_host_devices  # noqa: E402  (imports no JAX)

# Tests compile hundreds of small programs and run each for a few steps: LLVM's optimisation
# level 0 cuts XLA:CPU's compile time by about a third and changes no result beyond the tests'
# tolerances. Subprocesses inherit it. Benchmarks and users keep XLA's default.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
simulate_host_devices(8)

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
