"""The control loop: DFRA forwarding-node allocation at job start, live remapping on interference,
placement-pool hints (see docs/architecture.md, "Control loop")."""
