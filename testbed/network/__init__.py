"""The emulated network: the fabric builder, Mininet's net and nodes, servers, and load balancing."""
