"""Builds, trains and measures the demo model the repository ships (models/tiny-llava-shapes); see README.md."""
