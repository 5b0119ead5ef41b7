"""HTTP routers of the Pharos API, one module per resource.

One prefix convention: every router declares ``APIRouter(prefix=V1, tags=[...])`` and each
route names its path below it, so ``/v1`` + the decorator's path is the whole path (grep the
path without ``/v1``). The one route outside the versioned API is ``GET /metrics``
(:mod:`.metrics`, the Prometheus convention), whose router declares ``prefix=""``.
"""

#: The prefix of every versioned route.
V1 = "/v1"
