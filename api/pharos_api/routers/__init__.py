"""HTTP routers of the Pharos API, one module per resource."""
