"""What runs on the fabric: collective jobs, real programs, flows and bursts, experiment fabrics."""
