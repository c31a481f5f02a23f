"""A logits processor shipped by an installed package, as outside plug-ins are.

`PluginTargetToken` forces the token id a request names in `plugin_target_token` (a request-level
rule wrapped by `AdapterLogitsProcessor`); requests without that argument are left alone, so having
it installed changes nothing else. It imports the host's interface, as every plug-in does.
"""
from __future__ import annotations

from typing import Optional

import torch

from modules.logits_processors import AdapterLogitsProcessor, RequestLogitsProcessor, RequestParams

__version__ = "0.1.0"


class PluginTargetToken(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: RequestParams) -> Optional[RequestLogitsProcessor]:
        target = (params.extra_args or {}).get("plugin_target_token")
        if target is None:
            return None

        def keep_only_target(prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            keep = logits[target].clone()
            logits[:] = float("-inf")
            logits[target] = keep
            return logits

        return keep_only_target
