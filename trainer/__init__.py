"""pileprep trainer."""
