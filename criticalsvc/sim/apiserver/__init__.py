"""The API-server stand-in (moved from sim/apiserver.py; split into modules by the next commit)."""

from .standin import *  # noqa: F403
from .standin import DEFAULT_CRD_PATH, DISCOVERY_V2, OPENAPI_V2_PROTOBUF, StandInEngine, __all__, warning_headers  # noqa: F401
