"""Test setup: 8 fake CPU devices (must be set before jax is imported), float32 matmuls, and
one persistent compilation cache per test session.

The cache: many tests build the same tiny Run (same shapes, same step), each with fresh jit
objects, and child processes (CLI, kill-and-resume) compile it again; sharing compiled
programs through a session-scoped directory (inherited by the children through the
environment) roughly halves the loop tests' wall time. A new session starts empty.
"""
import atexit
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl_test_compile_cache_")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

if os.environ.get("JAXRL_TOL_LOG"):
    # Margin tables (results/numerics/): every assert_allclose also logs measured / tolerance.
    import numpy as np  # noqa: E402

    import numerics  # noqa: E402

    _assert_allclose = np.testing.assert_allclose

    def _logged_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kwargs):
        try:
            a = np.asarray(actual, np.float64)
            d = np.asarray(desired, np.float64)
            tol = atol + rtol * np.abs(d)
            excess = np.abs(a - d) - tol
            i = np.unravel_index(np.argmax(excess), np.shape(excess)) if np.ndim(excess) else ()
            numerics._log("allclose", float(np.abs(a - d)[i]), float(np.broadcast_to(tol, np.shape(excess))[i]), float(np.abs(d)[i] if np.ndim(d) else abs(d)))
        except (TypeError, ValueError):
            pass
        return _assert_allclose(actual, desired, rtol, atol, *args, **kwargs)

    np.testing.assert_allclose = _logged_allclose
