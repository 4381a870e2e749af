"""pileprep pipeline."""
