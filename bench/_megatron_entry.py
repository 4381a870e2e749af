"""Run one of Megatron-LM's scripts unchanged on this Python and machine (bench/megatron_side_by_side.py).

Megatron's `megatron.training` package imports its batch-invariant Triton kernels at import time
(megatron/training/initialize.py); preprocessing never calls them. Without Triton installed, a stand-in for
that one module goes into sys.modules (forked pool workers inherit it). Newer Megatron-LM (main at d98e8a64,
for tools/preprocess_data_fast.py) imports `typing.override`, new in Python 3.12: on an older Python it is
put on `typing` from typing_extensions (the same decorator: it only marks the method). Then the script runs
unchanged as __main__.

    python bench/_megatron_entry.py MEGATRON/tools/preprocess_data.py [its arguments]
"""
import runpy
import sys
import types
import typing

KERNELS = "megatron.core.transformer.custom_layers.batch_invariant_kernels"

if __name__ == "__main__":
    if not hasattr(typing, "override"):
        from typing_extensions import override

        typing.override = override
    try:
        import triton  # noqa: F401 - with Triton installed, Megatron imports its own module
    except ImportError:
        stand_in = types.ModuleType(KERNELS)
        stand_in.enable_batch_invariant_mode = lambda *args, **kwargs: None
        sys.modules[KERNELS] = stand_in
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
