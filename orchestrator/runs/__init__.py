"""Runs: their records and service, the live runtime-identity switch, the prompt's identity
section and the sweeper of runs whose bot went away."""
