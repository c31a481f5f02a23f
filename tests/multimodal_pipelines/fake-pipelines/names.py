"""Imported relatively by pipelines.py: relative imports inside a pipeline module must work."""
MODEL_NAME_MARKER = "fake-mm"
