"""Run one of Megatron-LM's scripts on a machine without Triton (bench/megatron_side_by_side.py).

Megatron's `megatron.training` package imports its batch-invariant Triton kernels at import time
(megatron/training/initialize.py); preprocessing never calls them. A stand-in for that one module goes into
sys.modules (forked pool workers inherit it), then the script runs unchanged as __main__.

    python bench/_megatron_entry.py MEGATRON/tools/preprocess_data.py [its arguments]
"""
import runpy
import sys
import types

KERNELS = "megatron.core.transformer.custom_layers.batch_invariant_kernels"

if __name__ == "__main__":
    try:
        import triton  # noqa: F401 - with Triton installed, Megatron imports its own module
    except ImportError:
        stand_in = types.ModuleType(KERNELS)
        stand_in.enable_batch_invariant_mode = lambda *args, **kwargs: None
        sys.modules[KERNELS] = stand_in
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
