"""pileprep's build script: only the optional C extension. Everything else — name, version, dependencies,
extras, pins, entry points — is in pyproject.toml (the one place).

setup.py stays because (1) an Extension with `optional=True` (an install without a compiler falls back to the
numpy codec, and model_contract/crc32c.py to numpy; `pileprep env` says which ones are active) has no declarative
form, and (2) Beam's
`--setup_file ./setup.py` runs `python setup.py sdist` and installs that sdist on every worker: setuptools reads
pyproject.toml for it, so workers get exactly the base dependencies and pins.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("model_contract._varint", ["model_contract/_varint.c"], optional=True),
                   Extension("model_contract._crc32c", ["model_contract/_crc32c.c"], optional=True),
                   Extension("transforms.shard._shingles", ["transforms/shard/_shingles.c"], optional=True)])
