"""transforms/io/filesystem_options.py and pipeline/beam_glue.py FilesystemOptions: the options pileprep gives
Beam's filesystems are read back from pileprep's own record, never from Beam's private attribute."""
from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam_glue import FilesystemOptions
from transforms.io import filesystem_options as fo


def test_the_options_given_are_remembered_and_replaced_by_the_next():
    try:
        fo.set_filesystem_options(PipelineOptions(["--s3_endpoint_url=http://minio:9000", "--s3_region_name=eu"]))
        assert fo.filesystem_options() == {"s3_endpoint_url": "http://minio:9000", "s3_region_name": "eu"}
        fo.filesystem_options()["s3_region_name"] = "changed"  # a copy: the record is not the caller's
        assert fo.filesystem_options()["s3_region_name"] == "eu"
        fo.set_filesystem_options(PipelineOptions([]))
        assert fo.filesystem_options() == {}
    finally:
        fo.set_filesystem_options(PipelineOptions([]))


def test_a_plan_s_filesystem_options_are_applied_on_top_of_those_given():
    try:
        fo.set_filesystem_options(PipelineOptions(["--s3_region_name=eu"]))
        FilesystemOptions({"s3_endpoint_url": "http://minio:9000"}).apply()
        assert fo.filesystem_options() == {"s3_endpoint_url": "http://minio:9000", "s3_region_name": "eu"}
        FilesystemOptions({"s3_endpoint_url": "http://other:9000"}).apply()
        assert fo.filesystem_options()["s3_endpoint_url"] == "http://other:9000"
    finally:
        fo.set_filesystem_options(PipelineOptions([]))
