"""Real-traffic rig: brokers, clients, tcpdump, scenarios and ground-truth manifests."""
