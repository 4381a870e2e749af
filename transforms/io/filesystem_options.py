"""The filesystem options this process gave Beam, kept here so pileprep never reads them back out of Beam.

Beam's `FileSystems.set_options` has no public getter (the options live in the private
`FileSystems._pipeline_options`). Every place pileprep sets them goes through `set_filesystem_options`, which
remembers the explicitly given options as a plain dict; readers (the empty-object PUT in
transforms/io/io_utils.py, the workers' re-apply in pipeline/beam_glue.py FilesystemOptions) read that dict.
"""
from __future__ import annotations

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

_GIVEN: dict = {}


def set_filesystem_options(options: PipelineOptions) -> None:
    """Give Beam's filesystems `options` (replacing what this process gave before) and remember them."""
    FileSystems.set_options(options)
    _GIVEN.clear()
    _GIVEN.update(options.get_all_options(drop_default=True))


def filesystem_options() -> dict:
    """The options last given through set_filesystem_options (non-default values only); {} when none were."""
    return dict(_GIVEN)
