"""pileprep: The Pile → tokenized, packed TFRecord shards (Apache Beam), retrieval corpora, and a trainer.

This file is the one place where dependency versions are pinned. Beam ships it to remote workers with
`--setup_file ./setup.py`; workers install only the base requirements (the pipeline's), not the trainer's.
"""
from setuptools import Extension, find_packages, setup

VERSION = "0.1.0"

# The pipeline (what every Beam worker needs).
BASE = [
    "apache-beam[aws,tfrecord]==2.77.0",
    "sentencepiece==0.2.3",
    "zstandard==0.25.0",
    "numpy==2.4.*",
    "protobuf==6.33.*",
    "pyarrow==25.0.1",
    "google-crc32c",
    "boto3",
]
EXTRAS = {
    # TensorFlow only to read shards with tf.data (tests, users' own input pipelines).
    "tf": ["tensorflow-cpu==2.21.0"],
    # Exactly 2.13.0: the CPU wheel on local disk; a looser pin pulls a multi-GB CUDA build.
    "train": ["torch==2.13.0"],
    "test": ["pytest==9.2.0", "pytest-timeout", "moto[server]"],
    # `pileprep report`'s plots (driver only; workers never import it).
    "report": ["matplotlib==3.11.2"],
}
EXTRAS["all"] = sorted({r for name in ("tf", "train", "test", "report") for r in EXTRAS[name]})

setup(
    name="pileprep",
    version=VERSION,
    description="Preprocess The Pile into tokenized, packed TFRecord shards for LLM training",
    packages=find_packages(include=["pipeline", "pipeline.*", "transforms", "transforms.*", "model_contract",
                                    "model_contract.*", "trainer", "trainer.*"]),
    python_requires=">=3.10",
    # Optional C accelerator for Example varints; without a compiler the install still works (numpy path).
    ext_modules=[Extension("model_contract._varint", ["model_contract/_varint.c"], optional=True)],
    install_requires=BASE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["pileprep = pipeline.cli:main"]},
)
