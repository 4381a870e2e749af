"""pileprep transforms."""
