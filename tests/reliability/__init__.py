"""Reliability: histories under kills, engine restarts, network faults and bad input."""
