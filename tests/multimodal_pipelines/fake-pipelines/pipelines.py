"""A test pipeline module, loaded through the loader like a `git clone`d one: the fake pipelines."""
from typing import List, Optional

from tests.multimodal_fake_pipeline import SPECS, make_pipeline

from .names import MODEL_NAME_MARKER

available_pipelines: List[str] = list(SPECS)


def get_pipeline(name: str, params: dict):
    return make_pipeline(name, params) if name in SPECS else None


def get_pipeline_from_model_name(model_name: str, params: dict) -> Optional[object]:
    return get_pipeline("fake-linear", params) if MODEL_NAME_MARKER in model_name else None
