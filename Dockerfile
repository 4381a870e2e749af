# pileprep worker image for Dataflow, Flink, Spark and Dask: Beam's Python SDK image (same Beam and Python as
# pyproject.toml pins) with pileprep installed and its C varint extension built. Build from the repository root:
#   docker build -t REGISTRY/pileprep-worker:0.1.0 .
#   docker push REGISTRY/pileprep-worker:0.1.0
# then run the job with  --sdk_container_image=REGISTRY/pileprep-worker:0.1.0  (Dataflow), or
#   --environment_type=DOCKER --environment_config=REGISTRY/pileprep-worker:0.1.0  (Flink / Spark portable),
# and without --setup_file: the image already holds pileprep and its pinned dependencies.
# tests/unit/tools/test_install.py checks this file's base image, build context and requirements without a Docker daemon.
FROM apache/beam_python3.11_sdk:2.77.0

# Only what the package needs (see .dockerignore), copied to a build directory that is removed afterwards: a
# source tree in the workers' working directory would shadow the installed package (and its built extension).
# The base image's WORKDIR and entry point (/opt/apache/beam/boot, the SDK harness) are left as they are.
COPY pyproject.toml setup.py README.md /tmp/pileprep-src/
COPY model_contract /tmp/pileprep-src/model_contract
COPY transforms /tmp/pileprep-src/transforms
COPY pipeline /tmp/pileprep-src/pipeline
COPY trainer /tmp/pileprep-src/trainer

# Workers need the pipeline plus S3 and GCS; the C extensions must build (the image has a compiler): fail the
# build if one did not, instead of shipping the numpy fallbacks (varints ~25x slower; --near-dedup's word
# shingles and signatures ~8x slower).
RUN pip install --no-cache-dir '/tmp/pileprep-src[aws,gcp]' \
 && rm -rf /tmp/pileprep-src \
 && cd / && python -c "from model_contract import example_codec as c; assert c._fast is not None, 'C varint codec not built'" \
 && python -c "from transforms.shard import near_dedup as n; assert n._fast is not None, 'C shingles not built'" \
 && pileprep env
