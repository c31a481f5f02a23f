"""The host's logger, under text-generation-webui's name (`from modules.logging_colors import logger`)."""
import logging
import sys

logger = logging.getLogger("text-generation-webui")

if not logger.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    # Tests use caplog, which listens on the root logger.
    logger.propagate = True
